"""The ``embodied`` command line: one console script with subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from embodied import __version__
from embodied.apps.allocator import keep_freed_memory


def _cmd_demo(args: argparse.Namespace) -> int:
    from embodied.apps.demo import QUICK, DemoConfig, run_demo, summary_text
    from embodied.core.config import load_config

    quick = QUICK if args.quick else []
    overrides = [*quick, *args.overrides] + ([f"out={args.out}"] if args.out else [])
    cfg = load_config(DemoConfig, args.config, overrides)
    run, outcomes = run_demo(cfg, echo=lambda line: print(line, flush=True))
    print("\n" + summary_text(outcomes))
    print(f"\nreport: {run.path / 'report.html'}")
    return 0


def _cmd_collect(args: argparse.Namespace) -> int:
    from embodied.apps.collect import CollectConfig, run_collect
    from embodied.core.config import load_config

    flags = {
        "task": args.task,
        "policy": args.policy,
        "episodes": args.episodes,
        "out": args.out,
        "noise": args.noise,
        "seed": args.seed,
        "workers": args.workers,
        "cutoff": args.cutoff,
        "rewind": args.rewind,
    }
    given = [f"{k}={v}" for k, v in flags.items() if v is not None]
    cfg = load_config(CollectConfig, args.config, [*given, *args.overrides])
    print(run_collect(cfg).line())
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from embodied.core.config import load_config
    from embodied.evaluation.report import EVAL_HEADERS, eval_rows, markdown_table
    from embodied.evaluation.suite import EvalConfig, run_eval

    flags = {
        "policy": args.policy,
        "suite": args.suite,
        "episodes": args.episodes,
        "seed": args.seed,
        "videos": args.videos,
        "workers": args.workers,
        "out": args.out,
    }
    given = [f"{k}={v}" for k, v in flags.items() if v is not None]
    if args.tasks:
        given.append(f"tasks=[{','.join(args.tasks)}]")
    cfg = load_config(EvalConfig, args.config, [*given, *args.overrides])
    run, results = run_eval(cfg)
    print(markdown_table(EVAL_HEADERS, eval_rows(results)))
    print(f"\nreport: {run.path / 'report.html'}")
    return 0


def _cmd_eval_reward(args: argparse.Namespace) -> int:
    from embodied.evaluation.reward import evaluate_reward, markdown, write_json

    rows = evaluate_reward(
        args.dataset,
        list(dict.fromkeys([args.model, *args.baselines])),
        args.frames,
        args.episodes,
    )
    print(markdown(rows))
    if args.json:
        write_json(args.json, rows)
    return 0


def _cmd_label(args: argparse.Namespace) -> int:
    from embodied.apps.label import run_label

    print(run_label(args.dataset, method=args.method, camera=args.camera).line())
    return 0


def _cmd_dataset_info(args: argparse.Namespace) -> int:
    from embodied.datasets import dataset_summary

    summary = dataset_summary(args.dataset)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
        return 0
    for key, value in summary.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for name, spec in value.items():
                print(f"  {name}: {spec}")
        else:
            print(f"{key}: {value}")
    return 0


def _cmd_dataset_validate(args: argparse.Namespace) -> int:
    from embodied.datasets import DatasetError, validate_dataset

    try:
        warnings = validate_dataset(args.dataset)
    except DatasetError as error:
        print(f"invalid dataset {args.dataset}: {error}", file=sys.stderr)
        return 1
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"{args.dataset}: valid LeRobot v3.0 dataset")
    return 0


def _run_training(args: argparse.Namespace, config_class: type, train: Any, saved: str) -> int:
    """``embodied train ...``: config file + overrides (+ ``--resume``), train, print where the
    result was saved (``saved`` names the run's sub-directory)."""
    from embodied.core.config import load_config

    overrides = list(args.overrides) + ([f"resume={args.resume}"] if args.resume else [])
    run = train(load_config(config_class, args.config, overrides))
    print(f"{saved}: {run.path / saved}")
    return 0


def _cmd_train_bc(args: argparse.Namespace) -> int:
    from embodied.train.bc import BCConfig, train_bc

    return _run_training(args, BCConfig, train_bc, "policy")


def _cmd_train_reward(args: argparse.Namespace) -> int:
    from embodied.train.reward import RewardTrainConfig, train_reward

    return _run_training(args, RewardTrainConfig, train_reward, "model")


def _cmd_train_grpo(args: argparse.Namespace) -> int:
    from embodied.train.grpo import GRPOConfig, train_grpo

    return _run_training(args, GRPOConfig, train_grpo, "policy")


def _cmd_train_tpo(args: argparse.Namespace) -> int:
    from embodied.train.tpo import TPOConfig, train_tpo

    return _run_training(args, TPOConfig, train_tpo, "policy")


def _cmd_tasks(args: argparse.Namespace) -> int:
    import embodied.sims as sims

    for name in sims.list_tasks(args.suite):
        print(name)
    return 0


def _bench_note(args: argparse.Namespace):
    """Progress lines on stderr while benchmarking (none when the output is JSON)."""
    if args.json:
        return None
    return lambda what: print(f"benchmarking {what} ...", file=sys.stderr, flush=True)


def _print_rows(rows: list, as_json: bool) -> int:
    """Bench rows as a table, or as JSON with ``--json``."""
    from embodied.apps.bench import format_table

    print(json.dumps([r.as_dict() for r in rows], indent=2) if as_json else format_table(rows))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    """Run ``embodied.apps.bench.<args.bench_function>`` with the command-line options of the same
    names (lists become tuples where the function's default is a tuple)."""
    import inspect

    from embodied.apps import bench

    run = getattr(bench, args.bench_function)
    kwargs = {}
    for name, param in inspect.signature(run).parameters.items():
        if name != "progress":
            value = getattr(args, name)
            kwargs[name] = tuple(value) if isinstance(param.default, tuple) else value
    return _print_rows(run(**kwargs, progress=_bench_note(args)), args.json)


def _cmd_bench_all(args: argparse.Namespace) -> int:
    """Every table, at settings that finish in minutes on a 2-core CPU."""
    import time

    from embodied.apps import bench

    note = _bench_note(args)
    start = time.perf_counter()
    tables = {
        "sim": lambda: bench.bench_sim(resolutions=(64, 128), steps=200, repeats=3, progress=note),
        "collect": lambda: bench.bench_collect(episodes=4, repeats=2, progress=note),
        "dataset": lambda: bench.bench_dataset(episodes=4, repeats=3, progress=note),
        "policy": lambda: bench.bench_policy(decisions=3, repeats=3, progress=note),
        "reward": lambda: bench.bench_reward(frames=50, repeats=3, progress=note),
        "train": lambda: bench.bench_train(image_size=64, batch_size=16, steps=2, progress=note),
        "rollout": lambda: bench.bench_rollout(episodes=4, repeats=2, progress=note),
    }
    results = {name: [r.as_dict() for r in run()] for name, run in tables.items()}
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps({"seconds": seconds, **results}, indent=2))
        return 0
    for name, rows in results.items():
        print(f"## bench {name}\n")
        print(bench.format_dicts(rows) + "\n")
    print(f"all benchmarks in {seconds:.0f} s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and documentation)."""
    parser = argparse.ArgumentParser(
        prog="embodied",
        description="Embodied and vision-language trajectory learning toolkit.",
    )
    parser.add_argument("--version", action="version", version=f"embodied {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        "demo",
        help="the whole pipeline: demos, reward model, BC, GRPO, before/after report",
    )
    demo.add_argument("config", nargs="?", default=None, help="YAML config (configs/demo.yaml)")
    demo.add_argument("overrides", nargs="*", help="dotted overrides, e.g. grpo.iterations=30")
    demo.add_argument("--out", default=None, help="root directory for the run (default: runs)")
    demo.add_argument(
        "--quick", action="store_true", help="toy sizes: the same pipeline in a few minutes"
    )
    demo.set_defaults(func=_cmd_demo)

    collect = sub.add_parser("collect", help="record rollouts into a LeRobot v3 dataset")
    collect.add_argument("config", nargs="?", default=None, help="YAML config (CollectConfig)")
    collect.add_argument("overrides", nargs="*", help="dotted overrides, e.g. image_size=128")
    collect.add_argument("--task", help="tabletop task or metaworld/<name>")
    collect.add_argument("--policy", choices=["expert", "random"], help="who acts")
    collect.add_argument("--episodes", type=int, help="number of episodes (seeds seed..)")
    collect.add_argument("--out", help="dataset directory (appended to if it exists)")
    collect.add_argument("--noise", type=float, help="Gaussian action noise std")
    collect.add_argument("--seed", type=int, help="first seed")
    collect.add_argument("--workers", type=int, help="parallel env workers")
    collect.add_argument("--cutoff", type=float, help="fraction of episodes cut off early")
    collect.add_argument("--rewind", type=float, help="fraction of successes also stored rewound")
    collect.set_defaults(func=_cmd_collect)

    ev = sub.add_parser("eval", help="success rates with intervals, videos and a report")
    ev.add_argument("config", nargs="?", default=None, help="YAML config (EvalConfig)")
    ev.add_argument("overrides", nargs="*", help="dotted overrides, e.g. image_size=96")
    ev.add_argument("--policy", help="saved policy directory, 'expert' or 'random'")
    ev.add_argument("--suite", choices=["tabletop", "metaworld"], help="task suite")
    ev.add_argument("--tasks", nargs="+", help="tasks (default: all; Meta-World: MT10)")
    ev.add_argument("--episodes", type=int, help="episodes per task")
    ev.add_argument("--seed", type=int, help="first seed (default 100000, held out)")
    ev.add_argument("--videos", type=int, help="videos per task")
    ev.add_argument("--workers", type=int, help="parallel env workers")
    ev.add_argument("--out", help="root directory of the run")
    ev.set_defaults(func=_cmd_eval)

    ev_reward = sub.add_parser(
        "eval-reward", help="VOC, AUROC, MAE, calibration of a reward model (also: eval reward)"
    )
    ev_reward.add_argument("--model", required=True, help="reward model dir, 'time' or judge:DIR")
    ev_reward.add_argument("--dataset", required=True, help="labelled LeRobot dataset")
    ev_reward.add_argument(
        "--baselines", nargs="*", default=["time"], help="more methods (default: time)"
    )
    ev_reward.add_argument("--frames", type=int, default=8, help="frames scored per episode")
    ev_reward.add_argument("--episodes", type=int, default=0, help="first N episodes (0: all)")
    ev_reward.add_argument("--json", default="", help="also write the rows to this JSON file")
    ev_reward.set_defaults(func=_cmd_eval_reward)

    label = sub.add_parser("label", help="write progress labels into a dataset")
    label.add_argument("dataset", help="LeRobot v3 dataset directory")
    label.add_argument("--method", choices=["procedure", "time"], default="procedure")
    label.add_argument("--camera", default=None, help="camera whose frames measure change")
    label.set_defaults(func=_cmd_label)

    dataset = sub.add_parser("dataset", help="inspect and check LeRobot v3 datasets")
    dataset_sub = dataset.add_subparsers(dest="target", metavar="ACTION", required=True)
    info = dataset_sub.add_parser("info", help="episodes, frames, tasks, features, success rate")
    info.add_argument("dataset")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=_cmd_dataset_info)
    validate = dataset_sub.add_parser("validate", help="check the layout; exit 1 on a problem")
    validate.add_argument("dataset")
    validate.set_defaults(func=_cmd_dataset_validate)

    train = sub.add_parser("train", help="train a policy or a reward model")
    train_sub = train.add_subparsers(dest="algorithm", metavar="ALGORITHM", required=True)
    bc = train_sub.add_parser("bc", help="behaviour cloning from a LeRobot v3 dataset")
    bc.add_argument("config", nargs="?", default=None, help="YAML config (BCConfig)")
    bc.add_argument("overrides", nargs="*", help="dotted overrides, e.g. steps=2000")
    bc.add_argument("--resume", default=None, help="run directory to continue exactly")
    bc.set_defaults(func=_cmd_train_bc)
    reward = train_sub.add_parser("reward", help="progress reward model from a labelled dataset")
    reward.add_argument("config", nargs="?", default=None, help="YAML config (RewardTrainConfig)")
    reward.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.d_model=128")
    reward.add_argument("--resume", default=None, help="run directory to continue exactly")
    reward.set_defaults(func=_cmd_train_reward)

    grpo = train_sub.add_parser("grpo", help="trajectory-level GRPO from a saved policy")
    grpo.add_argument("config", nargs="?", default=None, help="YAML config (GRPOConfig)")
    grpo.add_argument("overrides", nargs="*", help="dotted overrides, e.g. group_size=8")
    grpo.add_argument("--resume", default=None, help="run directory to continue exactly")
    grpo.set_defaults(func=_cmd_train_grpo)
    tpo = train_sub.add_parser("tpo", help="trajectory preference optimisation (GRAPE's TPO)")
    tpo.add_argument("config", nargs="?", default=None, help="YAML config (TPOConfig)")
    tpo.add_argument("overrides", nargs="*", help="dotted overrides, e.g. objective=safety")
    tpo.add_argument("--resume", default=None, help="run directory to continue exactly")
    tpo.set_defaults(func=_cmd_train_tpo)

    tasks = sub.add_parser("tasks", help="list the tasks of a suite")
    tasks.add_argument("--suite", default="tabletop", choices=["tabletop", "metaworld"])
    tasks.set_defaults(func=_cmd_tasks)

    bench = sub.add_parser("bench", help="speed benchmarks with in-run baselines")
    bench_sub = bench.add_subparsers(dest="target", metavar="TARGET", required=True)
    sim = bench_sub.add_parser("sim", help="env steps/s vs raw mj_step, state and cameras")
    sim.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sim.add_argument("--tasks", nargs="+", default=None, help="tabletop tasks (default: all)")
    sim.add_argument("--resolutions", nargs="+", type=int, default=[64, 96, 128, 224])
    sim.add_argument("--steps", type=int, default=300, help="env steps per timed run")
    sim.add_argument("--repeats", type=int, default=5, help="timed runs per figure (median)")
    sim.add_argument(
        "--no-metaworld", dest="metaworld", action="store_false", help="skip Meta-World rows"
    )
    sim.set_defaults(func=_cmd_bench, bench_function="bench_sim")
    coll = bench_sub.add_parser("collect", help="collection episodes/min and frames/s per worker")
    coll.add_argument("--json", action="store_true", help="print JSON instead of a table")
    coll.add_argument("--task", default="PickPlace")
    coll.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    coll.add_argument("--episodes", type=int, default=8, help="episodes per timed run")
    coll.add_argument("--image-size", type=int, default=96)
    coll.add_argument("--repeats", type=int, default=3, help="timed runs per figure (median)")
    coll.set_defaults(func=_cmd_bench, bench_function="bench_collect")
    data = bench_sub.add_parser("dataset", help="LeRobot dataset reads vs raw video decode")
    data.add_argument("--json", action="store_true", help="print JSON instead of a table")
    data.add_argument("--task", default="PickPlace")
    data.add_argument("--episodes", type=int, default=8, help="episodes collected and read")
    data.add_argument("--image-size", type=int, default=64)
    data.add_argument("--repeats", type=int, default=3, help="timed reads per figure (median)")
    data.set_defaults(func=_cmd_bench, bench_function="bench_dataset")
    pol = bench_sub.add_parser("policy", help="policy sampling: decisions/s and actions/s")
    pol.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pol.add_argument("--image-size", type=int, default=64)
    pol.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    pol.add_argument("--decisions", type=int, default=5, help="act() calls per timed run")
    pol.add_argument("--repeats", type=int, default=5, help="timed runs per figure (median)")
    pol.add_argument(
        "--policy", dest="policy_dirs", nargs="*", default=[], help="saved policy dirs to add"
    )
    pol.add_argument(
        "--device", default="cpu", help="cpu, cuda, cuda:N or auto (CUDA when available)"
    )
    pol.set_defaults(func=_cmd_bench, bench_function="bench_policy")
    rew = bench_sub.add_parser("reward", help="reward-model scoring frames/s, batched vs one clip")
    rew.add_argument("--json", action="store_true", help="print JSON instead of a table")
    rew.add_argument("--image-size", type=int, default=64)
    rew.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    rew.add_argument("--frames", type=int, default=100, help="frames per clip (a rollout)")
    rew.add_argument("--repeats", type=int, default=5, help="timed runs per figure (median)")
    rew.add_argument(
        "--model", dest="model_dirs", nargs="*", default=[], help="saved reward model dirs to add"
    )
    rew.add_argument(
        "--device", default="cpu", help="cpu, cuda, cuda:N or auto (CUDA when available)"
    )
    rew.set_defaults(func=_cmd_bench, bench_function="bench_reward")
    trn = bench_sub.add_parser("train", help="training steps/s, glibc malloc default vs kept")
    trn.add_argument("--json", action="store_true", help="print JSON instead of a table")
    trn.add_argument("--image-size", type=int, default=96)
    trn.add_argument("--batch-size", type=int, default=32)
    trn.add_argument("--steps", type=int, default=3, help="training steps per timed run")
    trn.add_argument("--repeats", type=int, default=3, help="timed runs per figure (median)")
    trn.add_argument(
        "--device", default="cpu", help="cpu, cuda, cuda:N or auto (CUDA when available)"
    )
    trn.set_defaults(func=_cmd_bench, bench_function="bench_train")
    rol = bench_sub.add_parser("rollout", help="GRPO-style rollouts: sync vs async vs Ray")
    rol.add_argument("--json", action="store_true", help="print JSON instead of a table")
    rol.add_argument("--task", default="PickPlace")
    rol.add_argument("--envs", type=int, default=4, help="envs per backend")
    rol.add_argument("--episodes", type=int, default=8, help="episodes per timed run")
    rol.add_argument("--repeats", type=int, default=3, help="timed runs per figure (median)")
    rol.add_argument("--ray-workers", type=int, default=2, help="Ray actors (when installed)")
    rol.set_defaults(func=_cmd_bench, bench_function="bench_rollout")
    every = bench_sub.add_parser("all", help="every table above, at quick settings")
    every.add_argument("--json", action="store_true", help="print JSON instead of tables")
    every.set_defaults(func=_cmd_bench_all)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``embodied`` console script."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["eval", "reward"]:  # `embodied eval reward ...` is the reward evaluation
        argv = ["eval-reward", *argv[2:]]
    args = parser.parse_args(argv)
    keep_freed_memory()  # glibc: reuse freed tensor buffers instead of page-faulting them in
    if getattr(args, "config", None) and "=" in args.config:
        args.overrides, args.config = [args.config, *args.overrides], None
    try:
        return args.func(args)
    except ValueError as error:  # bad input: a clear message, no traceback
        print(f"embodied {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
