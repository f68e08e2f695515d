"""``embodied average``: a run's checkpoints averaged into one policy that loads and acts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_policies import STATS, tiny_policies

from embodied.apps.cli import main
from embodied.policies import Policy
from embodied.train.averaging import average_run, checkpoint_steps
from embodied.train.checkpoints import save_checkpoint


def _run_with_checkpoints(root: Path, policies: list[Policy]) -> Path:
    """A run directory whose checkpoints at steps 1..n hold ``policies``, written as the trainers
    write them."""
    run = root / "run"
    for step, policy in enumerate(policies, start=1):
        optimizer = torch.optim.Adam(policy.parameters())
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        save_checkpoint(run / "checkpoints", step, policy, optimizer, scheduler)
    (run / "checkpoints" / ".tmp-step-0000009-1").mkdir()  # a save cut short: not a checkpoint
    return run


def _walk(policy: Policy, steps: int) -> list[Policy]:
    """Copies of ``policy`` whose parameters take random steps, as a noisy training run's do;
    a buffer (the EMA step counter) counts the steps."""
    out = []
    for _ in range(steps):
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.1 * torch.randn_like(p))
            policy.ema_steps += 1
        clone = type(policy)(policy.config)
        clone.load_state_dict(policy.state_dict())
        out.append(clone)
    return out


def test_the_average_is_the_mean_of_the_chosen_checkpoints_and_acts(tmp_path: Path) -> None:
    torch.manual_seed(0)
    policies = _walk(tiny_policies()["diffusion"].fit_normalizers(STATS), 4)
    run = _run_with_checkpoints(tmp_path, policies)
    assert list(checkpoint_steps(run)) == [1, 2, 3, 4]

    folder, steps = average_run(run, first=2)
    assert steps == [2, 3, 4] and folder == run / "policy-average-2-4"
    averaged = Policy.from_pretrained(folder)
    chosen = [dict(p.named_parameters()) for p in policies[1:]]
    for name, value in averaged.named_parameters():
        torch.testing.assert_close(value, sum(c[name] for c in chosen) / 3, atol=1e-6, rtol=0)
    assert int(averaged.ema_steps) == 4  # buffers: the last checkpoint's
    assert averaged.config == policies[0].config
    # One checkpoint averaged is that checkpoint; an explicit range and folder are kept.
    folder, steps = average_run(run, first=3, last=3, out=tmp_path / "one")
    assert steps == [3] and folder == tmp_path / "one"
    one = Policy.from_pretrained(folder).state_dict()
    for name, value in policies[2].state_dict().items():
        assert torch.equal(one[name], value), name
    # The averaged policy acts as its checkpoints do: a chunk of finite actions.
    obs = {
        "observation.state": torch.zeros(1, 2, 4),
        "observation.image": torch.zeros(1, 2, 32, 32, 3, dtype=torch.uint8),
    }
    actions = averaged.act(obs, ["reach the red block"], deterministic=True).actions
    assert actions.shape == (1, 4, 4) and torch.isfinite(actions).all()


def test_bad_runs_and_ranges_are_one_line_errors_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    planner = tiny_policies()["diffusion"]
    wider = tiny_policies(kernel_size=3)["diffusion"]
    run = _run_with_checkpoints(tmp_path, [planner, wider])

    assert main(["average", str(run), "--first", "5"]) == 2
    assert f"{run} has no checkpoint at steps 5..2 (it has [1, 2])" in capsys.readouterr().err
    assert main(["average", str(run)]) == 2
    err = capsys.readouterr().err
    assert "step-0000002/policy is not the policy of" in err and "['kernel_size']" in err
    assert main(["average", str(tmp_path / "nothing")]) == 2
    assert "is not a run directory with checkpoints" in capsys.readouterr().err
    assert main(["average", str(run), "--last", "1"]) == 0
    out = capsys.readouterr().out
    assert f"policy: {run / 'policy-average-1-1'} (the mean of 1 checkpoints" in out
