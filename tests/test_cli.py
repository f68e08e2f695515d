"""The command line, the sim benchmark, videos, rollouts and package layering."""

from __future__ import annotations

import ast
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest

import embodied.sims as sims
from embodied.apps.cli import main
from embodied.evaluation.video import write_video
from embodied.rollout.episodes import rollout_episode

ROOT = Path(__file__).resolve().parents[1]
PEERS = ("sims", "policies", "rewards", "datasets")


def test_help_lists_the_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("demo", "tasks", "bench"):
        assert re.search(rf"\b{command}\b", out), command


def test_tasks_lists_the_tabletop_suite(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks"]) == 0
    assert capsys.readouterr().out.split() == sims.list_tasks()


def test_bench_sim_reports_rates_against_raw_mujoco(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "sim", "--json", "--tasks", "Reach", "--resolutions", "32"]
    assert main([*args, "--steps", "20", "--repeats", "1", "--no-metaworld"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in rows] == ["state", "camera 32x32"]
    for row in rows:
        assert row["task"] == "Reach" and row["baseline"] == "raw mj_step x5"
        assert row["steps_per_s"] > 0 and row["baseline_steps_per_s"] > 0
        assert row["ratio"] == pytest.approx(row["baseline_steps_per_s"] / row["steps_per_s"])


def test_bench_memory_reports_further_envs_against_the_first(capsys) -> None:
    args = ["bench", "memory", "--json", "--tasks", "Reach", "--envs", "3", "--image-size", "16"]
    assert main([*args, "--repeats", "1"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["task"], row["camera"], row["envs"]) == ("Reach", "16x16 default", 3)
    # the first env loads the GL libraries and makes the render context the others draw with
    assert row["first_env_mb"] > row["further_env_mb"] > 0 and row["baseline"] == "the first env"
    assert row["ratio"] == pytest.approx(row["further_env_mb"] / row["first_env_mb"], abs=1e-3)
    assert main(["bench", "memory", "--envs", "1"]) == 2
    message = "envs = 1: need >= 2 (the bench compares further envs with the first)"
    assert capsys.readouterr().err == f"embodied bench memory: error: {message}\n"


# Run in a fresh interpreter: malloc only maps a large block when no free chunk in the heap fits
# it, and after earlier tests (run with memory kept, as `embodied` runs) the heap may hold one.
MALLOC_PROBE = """
import ctypes, json, sys
from embodied.apps.allocator import keep_freed_memory

libc = ctypes.CDLL(None)
libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd",
        "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc.mallinfo2.restype = MallInfo2
size = 64 << 20  # above glibc's largest mmap threshold (32 MiB)

def mapped_while_held():
    before = libc.mallinfo2().hblkhd  # bytes malloc mmapped (0 more: it came from the heap)
    block = libc.malloc(size)
    try:
        return libc.mallinfo2().hblkhd - before
    finally:
        libc.free(block)

rows = []
for keep, respect in json.loads(sys.argv[1]):
    rows.append([keep_freed_memory(keep, respect_environment=respect), mapped_while_held(), size])
print(json.dumps(rows))
"""


def malloc_probe(steps: list[tuple[bool, bool]], env: dict[str, str]) -> list[list]:
    """In a fresh interpreter, per (keep, respect_environment): applied?, bytes mapped, size."""
    out = subprocess.run(
        [sys.executable, "-c", MALLOC_PROBE, json.dumps(steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a setting of glibc's malloc")
def test_keep_freed_memory_serves_large_blocks_from_the_heap() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    (default, kept, restored) = malloc_probe([(False, False), (True, False), (False, False)], env)
    assert default[0] and default[1] >= default[2]  # glibc's default: a fresh mapping per block
    assert kept[0] and kept[1] == 0  # kept: served from (and freed back to) the heap
    assert restored[0]  # the defaults can be put back

    # The user's own malloc settings win: nothing is applied, their setting stays in force.
    env["MALLOC_MMAP_MAX_"] = "0"
    (user,) = malloc_probe([(False, True)], env)
    assert user == [False, 0, user[2]]


def test_bench_train_compares_kept_memory_with_glibc_default(capsys) -> None:
    args = ["bench", "train", "--json", "--image-size", "32", "--batch-size", "2"]
    assert main([*args, "--steps", "1", "--repeats", "1"]) == 0
    rows = json.loads(capsys.readouterr().out)
    glibc = platform.libc_ver()[0] == "glibc"
    settings = ["glibc default", "keep freed memory"] if glibc else ["system malloc"]
    models = ["progress (default)", "diffusion BC"]
    malloc, update, blocks = rows[:-4], rows[-4:-2], rows[-2:]
    assert [(r["model"], r["setting"]) for r in malloc] == [
        (m, a) for m in models for a in settings
    ]
    for i, row in enumerate(malloc):
        base = rows[i - i % len(settings)]  # the same model's first setting
        assert row["baseline"] == (settings[0] if glibc else "itself")
        assert row["speedup"] == pytest.approx(row["steps_per_s"] / base["steps_per_s"])
    # GRPO's update of 4 x batch decisions, the toolkit's Mish against torch's in a copy
    assert [r["setting"] for r in update] == ["nn.Mish (torch)", "Mish (embodied.core.nn)"]
    assert all(r["batch"] == 8 and r["baseline"] == "nn.Mish (torch)" for r in update)
    assert update[1]["speedup"] == pytest.approx(
        update[1]["steps_per_s"] / update[0]["steps_per_s"]
    )
    # ... and recomputing one block of 5 or 2 of each chain's 10 steps against all of them
    assert [r["setting"] for r in blocks] == ["update_steps=5", "update_steps=2"]
    for row in blocks:
        assert row["baseline"] == "all 10 steps"
        assert row["speedup"] == pytest.approx(row["steps_per_s"] / update[1]["steps_per_s"])


def test_bench_vision_reports_encoders_and_pixel_bc_against_their_baselines(capsys) -> None:
    args = ["bench", "vision", "--json", "--image-size", "32", "--batch", "2"]
    assert main([*args, "--steps", "1", "--repeats", "1"]) == 0
    rows = json.loads(capsys.readouterr().out)
    parts = {part: [r for r in rows if r["part"] == part] for part in ("encode", "bc step")}
    assert len(parts["encode"]) == 3 and parts["encode"][0]["variant"] == "resnet [32, 64]"
    bc = parts["bc step"]
    assert bc[0]["variant"] == "state planner (objects)"
    assert any("no cache" in r["variant"] for r in bc) and any("cached" in r["variant"] for r in bc)
    for group in parts.values():
        for row in group:
            assert row["per_s"] > 0
            assert row["ratio"] == pytest.approx(row["per_s"] / group[0]["per_s"])


@pytest.mark.parametrize(
    "target, device, message",
    [
        ("policy", "gpu0", "device='gpu0' is not a device"),
        ("reward", "cuda:x", "device='cuda:x' is not a device"),
        ("train", "warp", "device='warp' is not a device"),
    ],
)
def test_bench_names_a_bad_device(capsys, target: str, device: str, message: str) -> None:
    assert main(["bench", target, "--device", device]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--max-steps", "-3"], "max_steps = -3: expected >= 0 (0: the task's own limit)"),
        (["--multi", "0"], "multi = 0: expected 1 to 6 tabletop tasks"),
    ],
)
def test_bench_rollout_names_a_bad_setting(capsys, flags: list[str], message: str) -> None:
    assert main(["bench", "rollout", *flags]) == 2
    assert capsys.readouterr().err == f"embodied bench rollout: error: {message}\n"


def test_cuda_on_a_machine_without_it_is_a_clear_error(capsys) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["bench", "reward", "--device", "cuda"]) == 2
    assert "device='cuda', but CUDA is not available here" in capsys.readouterr().err


def test_bench_policy_reports_every_policy_against_ddim(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from embodied.policies import MLPConfig, MLPPolicy

    saved = MLPPolicy(MLPConfig(state_dim=4, action_dim=4)).save_pretrained(tmp_path / "mlp")
    args = ["bench", "policy", "--json", "--image-size", "32", "--batches", "1", "2"]
    assert main([*args, "--decisions", "1", "--repeats", "1", "--policy", str(saved)]) == 0
    rows = json.loads(capsys.readouterr().out)
    from embodied.apps.bench.policy import POLICY_VARIANTS

    labels = [r["policy"] for r in rows if r["batch"] == 1]
    variants = [label for label, _, _ in POLICY_VARIANTS]
    assert labels == [*variants, str(saved)]
    assert "diffusion DDIM-10 pixels efficientnet" in variants  # one row per camera encoder
    assert "vla decoding keypoints efficientnet" in variants
    by_key = {(r["policy"], r["batch"]): r for r in rows}
    for row in rows:
        base = by_key["diffusion DDIM-10", row["batch"]]
        assert row["baseline"] == f"diffusion DDIM-10 (batch {row['batch']})"
        assert row["speedup"] == pytest.approx(row["actions_per_s"] / base["actions_per_s"])
    # A diffusion chunk holds 8 actions, the MLP's one.
    ddim = by_key["diffusion DDIM-10", 2]
    assert ddim["actions_per_s"] == pytest.approx(ddim["decisions_per_s"] * 2 * 8)
    mlp = by_key["mlp gaussian", 2]
    assert mlp["actions_per_s"] == pytest.approx(mlp["decisions_per_s"] * 2)


def test_video_round_trip_is_close(tmp_path: Path) -> None:
    yy, xx = np.mgrid[0:33, 0:47]  # odd sizes are padded to even ones
    frames = np.stack(
        [np.stack([(xx * 5 + t * 8) % 256, yy * 7, np.full_like(xx, 90)], -1) for t in range(12)]
    ).astype(np.uint8)
    path = write_video(tmp_path / "clip.mp4", frames, fps=10, crf=10)
    with av.open(str(path)) as container:
        decoded = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert decoded.shape == (12, 34, 48, 3)
    mse = np.mean((decoded[:, :33, :47].astype(float) - frames) ** 2)
    assert 10 * np.log10(255**2 / mse) > 28  # PSNR in dB
    assert [p.name for p in tmp_path.iterdir()] == ["clip.mp4"]  # no temporary file left


def test_video_rejects_bad_frames(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"uint8 \[T, H, W, 3\], got float64 \[4, 8, 8\]"):
        write_video(tmp_path / "x.mp4", np.zeros((4, 8, 8)))
    with pytest.raises(ValueError, match="no frames"):
        write_video(tmp_path / "x.mp4", np.zeros((0, 8, 8, 3), np.uint8))
    assert list(tmp_path.iterdir()) == []


def test_rollout_records_the_episode() -> None:
    env = sims.make("ButtonPress", obs_mode="state")
    traj = rollout_episode(env, sims.make_expert(env), seed=4, suite="tabletop")
    assert traj.success and traj.terminated[-1] and not traj.truncated.any()
    assert traj.observations["agent_pos"].shape == (traj.length + 1, 4)
    assert traj.actions.shape == (traj.length, 4)
    assert traj.info["stage"][-1] == 1 and traj.info["collisions"].shape == (traj.length,)
    assert traj.instruction.endswith("button") and traj.task == "ButtonPress"
    assert traj.seed == 4 and traj.suite == "tabletop"
    # Same seed, same expert: the same trajectory.
    again = rollout_episode(env, sims.make_expert(env), seed=4, suite="tabletop")
    np.testing.assert_array_equal(again.actions, traj.actions)


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("peer", PEERS)
def test_peer_packages_never_import_each_other(peer: str) -> None:
    others = [p for p in PEERS if p != peer]
    for path in (ROOT / peer).rglob("*.py"):
        for module in _imported_modules(path):
            for other in others:
                assert not module.startswith(f"embodied.{other}"), f"{path} imports {module}"
            assert module.split(".")[0] not in PEERS, f"{path} imports {module} (use embodied.*)"


def test_importing_sims_does_not_import_torch() -> None:
    code = "import sys, embodied.sims; print('torch' in sys.modules, 'mujoco' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
