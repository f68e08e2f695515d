"""``embodied bench``: speed of the toolkit's parts, each beside a baseline from the same run.

One module a bench; every figure is the median of ``repeats`` timed runs. The command-line
options of ``embodied bench NAME`` are the bench function's keyword arguments, with its defaults:
they are written once, in the function's signature.
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
import typing
from collections.abc import Callable
from typing import Any

from embodied.apps.bench.collect import bench_collect
from embodied.apps.bench.common import format_dicts, format_table
from embodied.apps.bench.dataset import bench_dataset
from embodied.apps.bench.memory import bench_memory
from embodied.apps.bench.policy import bench_policy
from embodied.apps.bench.reward import bench_reward
from embodied.apps.bench.rollout import bench_rollout
from embodied.apps.bench.sim import bench_sim
from embodied.apps.bench.train import bench_train
from embodied.apps.bench.vision import bench_vision

# name -> (function, one line of help, help per option, flag names that differ from the argument)
BENCHES: dict[str, tuple[Callable[..., list[Any]], str, dict[str, str], dict[str, str]]] = {
    "sim": (bench_sim, "env steps/s vs raw mj_step, state and cameras", {
        "tasks": "tabletop tasks (default: all)", "steps": "env steps per timed run",
        "metaworld": "add Meta-World rows when it is installed",
    }, {}),
    "collect": (bench_collect, "collection episodes/min and frames/s per worker", {
        "episodes": "episodes per timed run",
    }, {}),
    "dataset": (bench_dataset, "LeRobot dataset reads vs raw video decode", {
        "episodes": "episodes collected and read",
    }, {}),
    "policy": (bench_policy, "policy sampling: decisions/s and actions/s", {
        "decisions": "act() calls per timed run", "policy_dirs": "saved policy dirs to add",
    }, {"policy_dirs": "--policy"}),
    "reward": (bench_reward, "reward-model scoring frames/s, batched vs one clip", {
        "frames": "frames per clip (8: what GRPO scores per rollout; 100: a whole rollout)",
        "model_dirs": "saved reward model dirs to add",
    }, {"model_dirs": "--model"}),
    "train": (bench_train, "training steps/s: glibc malloc default vs kept; a GRPO update with "
              "torch's Mish vs the toolkit's", {
        "steps": "training steps per timed run",
    }, {}),
    "vision": (bench_vision, "camera encoders' frames/s, pixel BC steps/s vs the state planner", {
        "batch": "frames (encoders) and windows (BC) per call",
        "steps": "calls per timed run",
    }, {}),
    "memory": (bench_memory, "memory per env: each further env of a task vs its first", {
        "tasks": "tasks (default: PickPlace, and Meta-World push when installed)",
        "envs": "envs per vector env", "image_size": "camera size (px)",
        "metaworld": "add a Meta-World row when it is installed",
    }, {}),
    "rollout": (bench_rollout, "GRPO-style rollouts: sync vs async vs Ray; a camera planner "
                "rendering only the images it reads vs every step, and over several tasks in "
                "one vector env vs a backend per task", {
        "envs": "envs per backend", "episodes": "episodes per timed run",
        "ray_workers": "Ray actors (when installed)",
        "max_steps": "episode step limit (0: the task's own)",
        "multi": "tabletop tasks in the multi-task rows (the camera planner over several tasks)",
    }, {}),
}  # fmt: skip
COMMON_HELP = {
    "repeats": "timed runs per figure (median)",
    "device": "cpu, cuda, cuda:N or auto (CUDA when available)",
}
# `embodied bench all`: every table at settings that finish in minutes on a 2-core CPU.
QUICK = {
    "sim": {"resolutions": (64, 128), "steps": 200, "repeats": 3},
    "collect": {"episodes": 4, "repeats": 2},
    "dataset": {"episodes": 4, "repeats": 3},
    "policy": {"decisions": 3, "repeats": 3},
    "reward": {"frames": (8, 50), "repeats": 3},
    "train": {"image_size": 64, "batch_size": 16, "steps": 2},
    "vision": {"batch": 16, "steps": 2, "repeats": 2},
    "rollout": {"episodes": 4, "repeats": 2},
    "memory": {"envs": 4, "repeats": 2},
}


def add_parsers(sub: Any) -> None:
    """``bench NAME`` parsers, their options read off each bench function's signature."""
    for name, (function, summary, helps, flags) in BENCHES.items():
        parser = sub.add_parser(name, help=summary)
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
        hints = typing.get_type_hints(function)
        for arg, param in inspect.signature(function).parameters.items():
            if arg == "progress":
                continue
            flag = flags.get(arg, "--" + arg.replace("_", "-"))
            text = helps.get(arg, COMMON_HELP.get(arg))
            default = param.default
            if isinstance(default, bool):
                parser.add_argument(f"--no-{arg.replace('_', '-')}", dest=arg,
                                    action="store_false", help=f"no: {text}")  # fmt: skip
            elif isinstance(default, tuple) or default is None:
                item = typing.get_args(hints[arg])[0]
                item = typing.get_args(item)[0] if typing.get_args(item) else item
                parser.add_argument(flag, dest=arg, nargs="*", type=item, default=default,
                                    help=text)  # fmt: skip
            else:
                parser.add_argument(flag, dest=arg, type=type(default), default=default, help=text)
        parser.set_defaults(bench=name)
    every = sub.add_parser("all", help="every table above, at quick settings")
    every.add_argument("--json", action="store_true", help="print JSON instead of tables")
    every.set_defaults(bench="all")


def run(args: argparse.Namespace, note: Callable[[str], None] | None) -> str:
    """The output of ``embodied bench`` for parsed ``args``: one table, or with ``all`` every
    table at quick settings, as text or JSON."""
    if args.bench != "all":
        function = BENCHES[args.bench][0]
        names = [p for p in inspect.signature(function).parameters if p != "progress"]
        kwargs = {n: tuple(v) if isinstance(v := getattr(args, n), list) else v for n in names}
        rows = function(**kwargs, progress=note)
        if args.json:
            return json.dumps([r.as_dict() for r in rows], indent=2)
        return format_table(rows)
    start = time.perf_counter()
    results = {
        name: [r.as_dict() for r in BENCHES[name][0](**quick, progress=note)]
        for name, quick in QUICK.items()
    }
    seconds = time.perf_counter() - start
    if args.json:
        return json.dumps({"seconds": seconds, **results}, indent=2)
    tables = [f"## bench {name}\n\n{format_dicts(rows)}\n" for name, rows in results.items()]
    return "\n".join(tables) + f"\nall benchmarks in {seconds:.0f} s"


__all__ = ["BENCHES", "add_parsers", "format_dicts", "format_table", "run"]
