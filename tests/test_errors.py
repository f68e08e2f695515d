"""Bad input gets one line naming what was wrong, before any output is written: a bad-config
matrix over every job, resumes that do not fit, corrupt saved files, and the CLI's own rules
(no traceback for a user error, ``--debug`` shows it, a closed pipe exits quietly)."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from embodied.apps.cli import main
from embodied.apps.collect import CollectConfig, run_collect
from embodied.policies import make_policy
from embodied.train.bc import BCConfig, train_bc

SEED_RANGE = "expected in [0, 4294967295]"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny state-only Reach dataset, a saved MLP policy, and a 4-step BC run of it."""
    root = tmp_path_factory.mktemp("errors")
    run_collect(CollectConfig(task="Reach", episodes=2, out=str(root / "data"), obs_mode="state"))
    policy = make_policy("mlp", state_dim=4, action_dim=4)
    policy.save_pretrained(root / "policy")
    run = train_bc(BCConfig(dataset=str(root / "data"), out=str(root / "runs"), policy="mlp",
                            steps=4, save_every=2, eval_episodes=0, device="cpu"))  # fmt: skip
    return {"data": root / "data", "policy": root / "policy", "run": run.path}


def _refused(argv: list[str], message: str, out: Path, capsys: pytest.CaptureFixture) -> str:
    """``embodied argv`` exits 2 with ``message`` in one line on stderr and writes nothing;
    returns that line."""
    out.mkdir(parents=True, exist_ok=True)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert not any(out.iterdir()), f"{argv} wrote {list(out.iterdir())}"
    return err


JOB_MATRIX = [
    ("bc", "steps=0", "config key 'steps' = 0 is out of range: expected >= 1"),
    ("bc", "steps=-5", "config key 'steps' = -5 is out of range: expected >= 1"),
    ("bc", "batch_size=0", "config key 'batch_size' = 0 is out of range: expected >= 1"),
    ("bc", "batch_size=1e8", "config key 'batch_size' expects int, got 100000000.0"),
    ("bc", "eval_every=0", "config key 'eval_every' = 0 is out of range: expected >= 1"),
    ("bc", "save_every=-1", "config key 'save_every' = -1 is out of range: expected >= 0"),
    ("bc", "log_every=0", "config key 'log_every' = 0 is out of range: expected >= 1"),
    ("bc", "eval_episodes=-2", "config key 'eval_episodes' = -2 is out of range: expected >= 0"),
    ("bc", "seed=-1", f"config key 'seed' = -1 is out of range: {SEED_RANGE}"),
    ("bc", "seed=9223372036854775806", f"= 9223372036854775806 is out of range: {SEED_RANGE}"),
    ("bc", "optim.lr=nan", "config key 'optim.lr' = nan: expected a finite number"),
    ("bc", "optim.lr=-1e-3", "config key 'optim.lr' = -0.001 is out of range: expected >= 0.0"),
    ("bc", "optim.schedule=warp", "'optim.schedule' = 'warp': expected one of ['cosine', 'const"),
    ("bc", "optim.betas=[0.9,1.5]", "optim: optim.betas = [0.9, 1.5]: expected each in [0, 1)"),
    ("bc", "n_obs_steps=0", "config key 'n_obs_steps' = 0 is out of range: expected >= 1"),
    ("reward", "steps=0", "config key 'steps' = 0 is out of range: expected >= 1"),
    ("reward", "batch_size=100000", "'batch_size' = 100000 is out of range: expected in [1, 4096]"),
    ("reward", "clip_len=1", "config key 'clip_len' = 1 is out of range: expected >= 2"),
    ("reward", "rewind=1.5", "config key 'rewind' = 1.5 is out of range: expected in [0.0, 1.0]"),
    ("reward", "val_fraction=1.0", "config key 'val_fraction' = 1.0 is out of range"),
    ("reward", "start_crop=nan", "config key 'start_crop' = nan: expected a finite number"),
    ("reward", "clip_len_max=4", "clip_len_max = 4: expected 0 or >= clip_len (8)"),
    ("reward", "seed=-1", f"config key 'seed' = -1 is out of range: {SEED_RANGE}"),
    ("reward", "optim.lr=nan", "config key 'optim.lr' = nan: expected a finite number"),
    ("reward", "eval_every=0", "config key 'eval_every' = 0 is out of range: expected >= 1"),
    ("reward", "save_every=-1", "config key 'save_every' = -1 is out of range: expected >= 0"),
    ("grpo", "iterations=0", "config key 'iterations' = 0 is out of range: expected >= 1"),
    ("grpo", "group_size=1", "config key 'group_size' = 1 is out of range: expected >= 2"),
    ("grpo", "keep_high=0.05", "keep_low = 0.1 > keep_high = 0.05"),
    ("grpo", "reward=success success_prob_weight=1", "model's success head: set reward=learned"),
    ("grpo", "clip_low=-0.1", "config key 'clip_low' = -0.1 is out of range: expected >= 0.0"),
    ("grpo", "loss_agg=sum", "config key 'loss_agg' = 'sum': expected one of"),
    ("grpo", "reward=vibes", "config key 'reward' = 'vibes': expected one of"),
    ("grpo", "reward_model=''", "reward=learned needs reward_model=<its directory>"),
    ("grpo", "train_seed=-5", f"config key 'train_seed' = -5 is out of range: {SEED_RANGE}"),
    ("grpo", "distributed.workers=0", "config key 'distributed.workers' = 0 is out of range"),
    ("grpo", "seed=-1", f"config key 'seed' = -1 is out of range: {SEED_RANGE}"),
    ("grpo", "eval_seed=4294967296", f"'eval_seed' = 4294967296 is out of range: {SEED_RANGE}"),
    ("grpo", "eval_episodes=-2", "config key 'eval_episodes' = -2 is out of range: expected >= 0"),
    ("grpo", "eval_every=0", "config key 'eval_every' = 0 is out of range: expected >= 1"),
    ("grpo", "save_every=-1", "config key 'save_every' = -1 is out of range: expected >= 0"),
    ("grpo", "optim.lr=nan", "config key 'optim.lr' = nan: expected a finite number"),
    ("grpo", "clip_high=nan", "config key 'clip_high' = nan: expected a finite number"),
    ("grpo", "keep_low=-0.5", "config key 'keep_low' = -0.5 is out of range: expected in [0.0, 1"),
    ("tpo", "rounds=0", "config key 'rounds' = 0 is out of range: expected >= 1"),
    ("tpo", "beta=-1", "config key 'beta' = -1.0 is out of range: expected >= 0.0"),
    ("tpo", "objective=fast", "config key 'objective' = 'fast': expected one of"),
    ("tpo", "pairs=some", "config key 'pairs' = 'some': expected one of ['best-worst', 'all']"),
    ("tpo", "reference=x", "config key 'reference' = 'x': expected one of ['round', 'initial']"),
    ("tpo", "seed=-1", f"config key 'seed' = -1 is out of range: {SEED_RANGE}"),
    ("tpo", "beta=nan", "config key 'beta' = nan: expected a finite number"),
    ("tpo", "optim.lr=nan", "config key 'optim.lr' = nan: expected a finite number"),
    ("tpo", "eval_episodes=-2", "config key 'eval_episodes' = -2 is out of range: expected >= 0"),
    ("tpo", "save_every=-1", "config key 'save_every' = -1 is out of range: expected >= 0"),
]  # fmt: skip


@pytest.mark.parametrize(("job", "override", "message"), JOB_MATRIX)
def test_every_job_refuses_a_bad_value_naming_the_key_and_range(
    job: str, override: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    required = {
        "bc": ["dataset=d"], "reward": ["dataset=d"], "grpo": ["policy=p", "reward_model=m"],
        "tpo": ["policy=p"],
    }[job]  # fmt: skip
    argv = ["train", job, *required, *override.split(" "), f"out={tmp_path / 'out'}"]
    _refused(argv, message, tmp_path / "out", capsys)


COLLECT_AND_EVAL = [
    (["collect", "--episodes", "0"], "config key 'episodes' = 0 is out of range: expected >= 1"),
    (["collect", "noise=nan"], "config key 'noise' = nan: expected a finite number"),
    (["collect", "noise=-0.1"], "config key 'noise' = -0.1 is out of range: expected >= 0.0"),
    (["collect", "--seed", "9223372036854775806"], f"out of range: {SEED_RANGE}"),
    (["collect", "--seed", "4294967290", "--episodes", "10"], "seed + episodes - 1, which must be"),
    (["collect", "--cutoff", "1.5"], "config key 'cutoff' = 1.5 is out of range"),
    (["collect", "--workers", "0"], "config key 'workers' = 0 is out of range: expected >= 1"),
    (["collect", "image_size=0"], "config key 'image_size' = 0 is out of range: expected in [8,"),
    (["collect", "fps=0"], "config key 'fps' = 0 is out of range: expected >= 1"),
    (["collect", "--policy", "random", "record=expert"], "record='expert' labels frames with"),
    (["collect", "--task", "Fly"], "unknown task 'Fly'"),
    (["eval", "--episodes", "0"], "config key 'episodes' = 0 is out of range: expected >= 1"),
    (["eval", "--videos", "-1"], "config key 'videos' = -1 is out of range: expected >= 0"),
    (["eval", "--seed", "-1"], f"config key 'seed' = -1 is out of range: {SEED_RANGE}"),
    (["eval", "--suite", "mars"], "invalid choice: 'mars'"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "message"), COLLECT_AND_EVAL)
def test_collect_and_eval_refuse_bad_values(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "out"
    flag = ["--out", str(out / "data")] if argv[0] == "collect" else ["--out", str(out)]
    out.mkdir()
    if "invalid choice" in message:  # argparse's own refusal: usage and exit 2
        with pytest.raises(SystemExit) as stop:
            main([*argv, *flag])
        assert stop.value.code == 2 and message in capsys.readouterr().err
        return
    _refused([*argv, *flag], message, out, capsys)


def test_an_absurd_batch_size_is_refused_with_its_memory_estimate(
    saved: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A batch that cannot fit in this machine's memory is refused before the run starts, with
    what it would need and the largest size that fits (not a hang or an out-of-memory kill)."""
    argv = ["train", "bc", f"dataset={saved['data']}", "policy=mlp", "batch_size=1000000000000",
            f"out={tmp_path / 'out'}", "device=cpu"]  # fmt: skip
    err = _refused(argv, "batch_size = 1000000000000 needs", tmp_path / "out", capsys)
    pattern = r"batch_size = 1000000000000 needs [\d.]+ GiB per batch .* GiB: use at most \d+"
    assert re.search(pattern, err), err


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--frames", "0"], "config key 'frames' = 0 is out of range: expected >= 2"),
        (["--episodes", "-1"], "config key 'episodes' = -1 is out of range: expected >= 0"),
    ],
)
def test_eval_reward_refuses_bad_counts(
    saved: dict[str, Path], flag: list[str], message: str, tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:  # fmt: skip
    """``--episodes -1`` once silently dropped the last episode; both are refused now."""
    out = tmp_path / "scores.json"
    _refused(["eval", "reward", "--model", "time", "--dataset", str(saved["data"]), *flag,
              "--json", str(out)], message, tmp_path, capsys)  # fmt: skip


def test_resume_accepts_only_a_run_of_the_same_job_with_the_same_settings(
    saved: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    base = ["train", "bc", f"dataset={saved['data']}", "policy=mlp", "steps=4", "save_every=2",
            "eval_episodes=0", "device=cpu"]  # fmt: skip
    _refused([*base, "--resume", str(saved["data"])], "is not a run directory (no config.yaml)",
             tmp_path / "a", capsys)  # fmt: skip
    _refused([*base, "steps=8", "--resume", str(saved["run"])],
             "was run with other settings: steps (4 -> 8)", tmp_path / "b", capsys)  # fmt: skip
    grpo = ["train", "grpo", f"policy={saved['policy']}", "reward=success"]
    _refused([*grpo, "--resume", str(saved["run"])], "is not a run of this job (GRPOConfig)",
             tmp_path / "c", capsys)  # fmt: skip


def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(saved["run"], run)
    shutil.rmtree(run / "policy")
    latest = run / "checkpoints" / "step-0000004"
    (latest / "policy" / "model.safetensors").write_bytes(b"\x00garbage")
    cfg = BCConfig(dataset=str(saved["data"]), policy="mlp", steps=4, save_every=2,
                   eval_episodes=0, device="cpu", resume=str(run))  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_bc(cfg)
    assert any("step-0000004" in str(w.message) and "unreadable" in str(w.message) for w in caught)
    assert (run / "policy" / "model.safetensors").is_file()  # resumed from step 2 and finished


def test_the_fallback_warning_is_one_line_on_the_command_line(
    saved: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """From the CLI, the warning that a damaged checkpoint was skipped is one line in the
    CLI's own form, not Python's file:line display with the warning's source line."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(saved["run"], run)
    shutil.rmtree(run / "policy")
    (run / "checkpoints" / "step-0000004" / "trainer.json").write_bytes(b"{not json")
    argv = ["train", "bc", f"dataset={saved['data']}", "policy=mlp", "steps=4", "save_every=2",
            "eval_episodes=0", "device=cpu", "--resume", str(run)]  # fmt: skip
    assert main(argv) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "step-0000004" in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("embodied train bc: warning: checkpoint "), lines
    assert "unreadable" in lines[0] and "UserWarning" not in lines[0]


CORRUPT_TRAINER = [
    ("trainer.json", b"{not json", "trainer.json: not readable JSON"),
    ("trainer.json", b"[1, 2]", "trainer.json: expected a JSON object, got list"),
    ("trainer.json", b'{"step": 4}', "trainer state does not fit this run (KeyError('optimizer'))"),
    ("trainer.safetensors", b"\x00garbage", "trainer state does not fit this run"),
]


@pytest.mark.parametrize(("name", "content", "message"), CORRUPT_TRAINER)
def test_a_corrupt_trainer_state_falls_back_then_is_one_line(
    saved: dict[str, Path], name: str, content: bytes, message: str, tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:  # fmt: skip
    """A damaged trainer state in the newest checkpoint: the run resumes from the one before,
    warning with the file; damaged in every checkpoint: one line, nothing resumed."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(saved["run"], run)
    shutil.rmtree(run / "policy")
    checkpoints = sorted((run / "checkpoints").iterdir())
    (checkpoints[-1] / name).write_bytes(content)
    cfg = BCConfig(dataset=str(saved["data"]), policy="mlp", steps=4, save_every=2,
                   eval_episodes=0, device="cpu", resume=str(run))  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_bc(cfg)
    assert any(message in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert (run / "policy" / "model.safetensors").is_file()  # resumed from step 2 and finished
    for checkpoint in sorted((run / "checkpoints").iterdir()):
        (checkpoint / name).write_bytes(content)
    argv = ["train", "bc", f"dataset={saved['data']}", "policy=mlp", "steps=4", "save_every=2",
            "eval_episodes=0", "device=cpu", "--resume", str(run)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # One warning line per checkpoint tried, then the one error line.
    *warned, error = err.strip().splitlines()
    assert error.startswith("embodied train bc: error: no readable checkpoint in"), err
    assert len(warned) == len(checkpoints), err
    assert all(w.startswith("embodied train bc: warning: checkpoint ") for w in warned), err


CORRUPT_POLICY = [
    ("model.safetensors", b"\x00\x01garbage", "model.safetensors: not a readable safetensors file"),
    ("config.json", b"[1, 2]", "config.json: expected a JSON object, got list"),
    ("config.json", b"{not json", "config.json: not readable JSON"),
    ("config.json", b'{"policy_type": "warp"}', "unknown policy_type 'warp'"),
]


@pytest.mark.parametrize(("name", "content", "message"), CORRUPT_POLICY)
def test_a_corrupt_saved_policy_is_one_line_naming_the_file(
    saved: dict[str, Path], name: str, content: bytes, message: str, tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:  # fmt: skip
    import shutil

    policy = tmp_path / "policy"
    shutil.copytree(saved["policy"], policy)
    (policy / name).write_bytes(content)
    _refused(["eval", "--policy", str(policy), "--tasks", "Reach", "--out", str(tmp_path / "o")],
             message, tmp_path / "o", capsys)  # fmt: skip


def test_a_too_long_run_name_is_one_line(saved: dict[str, Path], tmp_path: Path, capsys) -> None:
    argv = ["train", "bc", f"dataset={saved['data']}", "policy=mlp", "steps=1", "eval_episodes=0",
            f"name={'x' * 240}", f"out={tmp_path}", "device=cpu"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "File name too long" in err and "Traceback" not in err


def test_debug_shows_the_traceback_and_a_closed_pipe_exits_quietly(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "embodied.apps.cli", "collect", "--episodes", "0", "--debug",
               "--out", str(tmp_path / "d")]  # fmt: skip
    debug = subprocess.run(command, capture_output=True, text=True)
    assert debug.returncode != 0 and "Traceback" in debug.stderr
    info = [sys.executable, "-m", "embodied.apps.cli", "dataset", "info", str(saved["data"])]
    piped = subprocess.run(f"{' '.join(info)} | head -c 1", shell=True, capture_output=True,
                           text=True)  # fmt: skip
    assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr


CTRL_C_AT_EXIT = """
import atexit, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's, not a background job's
from embodied.apps.cli import run
atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))  # Ctrl-C while Python shuts down
run(sys.argv[1:])
"""


def test_a_ctrl_c_after_the_command_finished_is_ignored() -> None:
    """The console script's work is done and saved once its command returns: a Ctrl-C while
    Python shuts down neither prints a traceback nor turns the exit status into the signal."""
    done = subprocess.run([sys.executable, "-c", CTRL_C_AT_EXIT, "tasks"], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Reach" in done.stdout and "Traceback" not in done.stderr, done.stderr


CTRL_C_IN_A_FINALISER = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's, not a background job's
import embodied.apps.cli as cli

class ProgressBar:
    def __del__(self):  # Ctrl-C lands while the bar is being collected
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass

def tasks(args):
    ProgressBar()
    for _ in range(10**7):  # the command goes on working
        pass
    print("finished")
    return 0

cli._cmd_tasks = tasks
cli.run(sys.argv[1:])
"""


def test_a_ctrl_c_landing_in_a_finaliser_interrupts_the_command() -> None:
    """Ctrl-C can arrive while Python runs an object's ``__del__`` (a progress bar being
    collected): the command is interrupted as usual (one line, exit 130), not left running after
    a printed "Exception ignored ... Traceback"."""
    done = subprocess.run([sys.executable, "-c", CTRL_C_IN_A_FINALISER, "tasks"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert done.stderr == "embodied tasks: interrupted\n" and "finished" not in done.stdout
