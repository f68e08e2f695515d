"""``embodied demo``: the whole pipeline at toy sizes, its report, its config and its bad input."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import av
import numpy as np
import pytest

from embodied.apps.cli import main
from embodied.apps.demo import QUICK, STATE, DemoConfig, presets, stage_configs
from embodied.core.config import load_config
from embodied.core.policy import Policy
from embodied.core.run import read_metrics
from embodied.datasets import LeRobotDataset

ROOT = Path(__file__).resolve().parents[1]
TASK = DemoConfig().tasks[0]  # the demo's default task
TINY = [  # on top of --quick: the smallest run that still goes through every stage
    "demos=4",
    "dart=2",
    "failures.episodes=4",
    "reward.steps=4",
    "reward.eval_every=2",
    "reward.log_every=2",
    "bc.steps=8",
    "bc.log_every=2",
    "grpo.iterations=1",
    "grpo.group_size=2",
    "grpo.epochs=1",
    "grpo.keep_low=0.0",  # keep every group with varied returns (BC this small rarely succeeds)
    "eval_episodes=4",
    "eval_envs=4",
]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One tiny demo shared by the tests below: its run directory and what it printed."""
    out = tmp_path_factory.mktemp("demo")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["demo", "--quick", *TINY, "--out", str(out)]) == 0
    (run,) = out.iterdir()
    return run, printed.getvalue()


@pytest.mark.slow  # the whole pipeline at toy sizes: minutes
def test_demo_runs_every_stage_and_reports_before_and_after(demo_run: tuple[Path, str]) -> None:
    run, stdout = demo_run
    for i, stage in enumerate(("collect", "label", "reward model", "bc", "eval bc", "grpo")):
        assert f"[{TASK}] {i + 1}/7 {stage}" in stdout
    assert re.search(
        rf"\| {TASK} \| \d+% \(\d+%-\d+%\) \| \d+% \(\d+%-\d+%\) \| [+-]\d+ points", stdout
    )
    assert f"report: {run / 'report.html'}" in stdout

    (task,) = json.loads((run / "results.json").read_text())["tasks"]
    assert task["task"] == TASK
    bc, grpo = task["bc"], task["grpo"]
    assert bc["episodes"] == grpo["episodes"] == 4
    assert bc["instructions"] == grpo["instructions"]  # the same held-out seeds before and after
    assert task["separated"] == (grpo["ci_low"] > bc["ci_high"])
    assert set(task["seconds"]) == {"collect", "label", "reward model", "bc", "eval bc", "grpo",
                                    "eval grpo"}  # fmt: skip
    # each stage is an ordinary run, inside the demo's directory
    assert (Path(task["runs"]["reward"]) / "model" / "config.json").is_file()
    assert (Path(task["runs"]["bc"]) / "policy" / "config.json").is_file()
    assert (Path(task["runs"]["grpo"]) / "policy" / "config.json").is_file()
    assert all(Path(p).parent == run / TASK for p in task["runs"].values())
    grpo_metrics = read_metrics(task["runs"]["grpo"])
    assert [m["step"] for m in grpo_metrics if "rollout/success_rate" in m] == [1]
    assert any("monitor/reward_corr" in m for m in grpo_metrics)
    # the reward model scored every evaluation episode, one value per observation
    for name, result in (("BC", bc), ("GRPO", grpo)):
        curves = task["learned_progress"][name]
        assert len(curves) == 4
        curve_lengths = [len(c) for c in curves]
        assert curve_lengths == [len(p) + 1 for p in result["progress_curves"]]
        assert all(0.0 <= v <= 1.0 for c in curves for v in c)

    data = run / "data"
    assert sorted(p.name for p in data.iterdir()) == [f"{TASK}-demos", f"{TASK}-failures"]
    cfg = load_config(DemoConfig, run / "config.yaml")
    assert cfg.demos == 4 and cfg.grpo["iterations"] == 1
    # the planner learnt from clean and DART demos, and reads the camera, never the object state
    assert LeRobotDataset(data / f"{TASK}-demos").num_episodes == 4 + 2
    for stage in ("bc", "grpo"):
        spec = Policy.from_pretrained(Path(task["runs"][stage]) / "policy").observation_spec
        assert spec.cameras == {"observation.image": (64, 64)} and not spec.privileged


@pytest.mark.slow  # the whole pipeline at toy sizes: minutes
def test_demo_report_has_plots_and_playable_videos(demo_run: tuple[Path, str]) -> None:
    run, _ = demo_run
    page = (run / "report.html").read_text()
    # success, learning curves, progress, the camera's frames, monitor
    assert page.count("data:image/png;base64,") == 5
    assert "What the camera sees" in page
    assert "4 + 2 DART expert demonstrations" in page and "reading the front camera (64 px)" in page
    assert "intervals separate" in page and "Reward-hacking monitor" in page
    videos = re.findall(r'<video src="([^"]+)"', page)
    assert videos == [f"videos/bc-{TASK}-100000.mp4", f"videos/grpo-{TASK}-100000.mp4"]
    for video in videos:
        with av.open(str(run / video)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(frames) > 5 and frames[0].shape == (192, 192, 3)  # 64 px camera, enlarged
    for png in (
        "success.png",
        *(f"{TASK}-{kind}.png" for kind in ("curves", "progress", "monitor", "camera")),
    ):
        assert (run / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # the whole pipeline at toy sizes: minutes
@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium on this machine")
def test_demo_report_renders_in_headless_chromium(demo_run: tuple[Path, str]) -> None:
    run, _ = demo_run
    shot = run / "screenshot.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    page = (run / "report.html").as_uri()
    command = ["chromium", *flags, "--window-size=1000,1400", f"--screenshot={shot}", page]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    import cv2

    image = cv2.imread(str(shot))
    assert image is not None and image.shape == (1400, 1000, 3)
    # the page drew something: text and plots, not a blank or an error page of one colour
    assert (image < 200).mean() > 0.02 and len(np.unique(image.reshape(-1, 3), axis=0)) > 50


def test_the_presets_name_real_keys() -> None:
    assert all("=" in override for override in QUICK + STATE)
    quick = load_config(DemoConfig, None, QUICK)
    assert quick.demos == 10 and quick.grpo["iterations"] == 2
    state = load_config(DemoConfig, None, STATE)
    assert (state.inputs, state.dart) == ("state", 0)
    assert (state.bc["steps"], state.bc["policy_overrides"]["n_action_steps"]) == (1000, 4)
    # --state keeps the recipe its results were measured with, whatever the camera demo's is
    assert (state.reward["steps"], state.grpo["iterations"]) == (400, 16)
    assert state.bc["policy_overrides"]["cond_mlp_dims"] == [256, 256]  # merged, not replaced
    both = load_config(DemoConfig, None, presets(quick=True, state=True))
    assert both.inputs == "state" and (both.bc["steps"], both.reward["steps"]) == (40, 20)
    assert (DemoConfig().inputs, DemoConfig().dart) == ("cameras", 100)  # make demo sees


@pytest.mark.parametrize("inputs", ["cameras", "state"])
def test_the_planner_reads_what_inputs_names(inputs: str, tmp_path: Path) -> None:
    cfg = load_config(DemoConfig, None, [f"inputs={inputs}", "image_size=48", "dart=5"])
    plan = stage_configs(cfg, TASK, tmp_path)
    overrides = plan["bc"].policy_overrides
    assert plan["failures"].image_size == 48  # the reward model's frames
    assert plan["dart"].out == plan["demos"].out and plan["dart"].record == "expert"
    if inputs == "cameras":
        assert overrides["image_keys"] == ["observation.image"]
        assert plan["demos"].image_size == 48 and plan["demos"].cameras == ["front"]
    else:
        assert overrides["image_keys"] == [] and plan["demos"].obs_mode == "state"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("grpo.iterationz=3", "unknown config key 'iterationz' (in the demo's grpo section)"),
        ("bc.steps=many", "config key 'steps' expects int, got 'many' (in the demo's bc section)"),
        ("grpo.policy=runs/x", "grpo.policy is set by the demo itself"),
        ("tasks=[Fly]", "tasks = ['Fly']: expected tabletop tasks"),
        ("eval_episodes=0", "config key 'eval_episodes' = 0 is out of range: expected >= 1"),
        ("seed=-1", "config key 'seed' = -1 is out of range: expected in [0, 4294967295]"),
        ("bc.batch_size=0", "config key 'batch_size' = 0 is out of range: expected >= 1"),
        ("demoz=3", "unknown config key 'demoz'"),
        ("failures.image_size=96", "failures.image_size is set by the demo itself"),
        ("inputs=pixels", "config key 'inputs' = 'pixels'"),
    ],
)
def test_demo_bad_input_is_a_clear_error_before_any_work(
    override: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", override, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # no run directory was made
