"""ObjectStateEncoder: grouping named state values into objects, and picking the object an
instruction names (what the flat state encoder fails to learn from few demonstrations)."""

from __future__ import annotations

import pytest
import torch

from embodied.core.nn import InstructionEncoder, ObjectStateEncoder, build_vocab, object_groups

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

COLORS = ("red", "blue", "yellow")
# Three blocks (x, y, z) and a distractor with one value, in an interleaved order.
NAMES = [f"block_{c}.{q}" for c in COLORS for q in "xyz"] + ["drawer.opening"]


def test_object_groups_follow_first_appearance():
    assert object_groups(["b.x", "a.x", "b.y", "c", "a.y"]) == [
        ("b", [0, 2]),
        ("a", [1, 4]),
        ("c", [3]),
    ]
    assert object_groups(NAMES)[-1] == ("drawer", [9])


def batch(n: int, generator: torch.Generator) -> tuple[torch.Tensor, list[str], torch.Tensor]:
    """Random states, an instruction naming one block each, and that block's xyz (the target)."""
    state = torch.randn(n, len(NAMES), generator=generator)
    pick = torch.randint(0, 3, (n,), generator=generator)
    instructions = [f"go to the {COLORS[i]} block" for i in pick.tolist()]
    target = torch.stack([state[b, 3 * i : 3 * i + 3] for b, i in enumerate(pick.tolist())])
    return state, instructions, target


def test_encoder_learns_to_read_the_named_object():
    torch.manual_seed(0)
    vocab = build_vocab([f"go to the {c} block" for c in COLORS] + ["block_red drawer"])
    words = InstructionEncoder(vocab, 16)
    encoder = ObjectStateEncoder(NAMES, words, 16, n_queries=2, n_heads=2)
    head = torch.nn.Linear(encoder.output_dim, 3)
    params = [*words.parameters(), *encoder.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params, lr=3e-3)
    g = torch.Generator().manual_seed(1)

    def predict(state: torch.Tensor, instructions: list[str]) -> torch.Tensor:
        return head(encoder(state, words(instructions), words))

    for _ in range(400):
        state, instructions, target = batch(64, g)
        loss = (predict(state, instructions) - target).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    state, instructions, target = batch(512, torch.Generator().manual_seed(2))  # unseen states
    with torch.no_grad():
        error = (predict(state, instructions) - target).pow(2).mean().item()
    assert encoder.output_dim == 32 and predict(state, instructions).shape == (512, 3)
    # Guessing a block (or averaging the three) leaves an error near 1 (values are N(0, 1)).
    assert error < 0.1, error
    # The instruction decides: asking for another block moves the prediction to that block.
    other = [
        f"go to the {COLORS[(COLORS.index(i.split()[3]) + 1) % 3]} block" for i in instructions
    ]
    with torch.no_grad():
        assert (predict(state, other) - target).pow(2).mean().item() > 0.5


def test_relative_tokens_read_each_object_from_the_hand():
    from embodied.core.nn import ObjectTokens

    torch.manual_seed(0)
    tokens = ObjectTokens(NAMES, embed_dim=8, relative=True)
    assert tokens.value_proj.in_features == 3 + 3  # x, y, z (padded) + the offset from the hand
    names = torch.zeros(4, 8)
    raw = torch.randn(2, len(NAMES))
    hand = torch.zeros(2, 3)
    base = tokens(raw, names, raw, hand)
    # Moving the hand by 10 cm along x shifts every block's offset input by -1 and the drawer
    # (no xyz) not at all: exactly -W[:, 3] for the blocks through the linear map.
    moved = tokens(raw, names, raw, hand + torch.tensor([0.1, 0.0, 0.0]))
    weight = tokens.value_proj.weight[:, 3]
    for o in range(3):
        torch.testing.assert_close(moved[:, o] - base[:, o], -weight.expand(2, -1))
    torch.testing.assert_close(moved[:, 3], base[:, 3])
    with pytest.raises(ValueError, match="need the raw state and the hand"):
        tokens(raw, names)
