"""The ``embodied`` command line: one console script with subcommands."""

from __future__ import annotations

import _thread
import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

from embodied import __version__
from embodied.apps.allocator import keep_freed_memory


def _cmd_demo(args: argparse.Namespace) -> int:
    from embodied.apps.demo import DemoConfig, presets, run_demo
    from embodied.apps.demo_report import summary_text
    from embodied.core.config import load_config

    overrides = [*presets(args.quick, args.state), *args.overrides] + (
        [f"out={args.out}"] if args.out else []
    )
    cfg = load_config(DemoConfig, args.config, overrides)
    run, outcomes = run_demo(cfg, echo=lambda line: print(line, flush=True))
    print("\n" + summary_text(outcomes))
    print(f"\nreport: {run.path / 'report.html'}")
    return 0


def _config(schema: type, args: argparse.Namespace, flags: Sequence[str]) -> Any:
    """``schema`` from the config file, then the ``--flags`` given, then ``key=value``
    overrides (a list flag becomes ``key=[a,b]``)."""
    from embodied.core.config import load_config

    given = []
    for name in flags:
        value = getattr(args, name)
        if isinstance(value, list):
            given.append(f"{name}=[{','.join(value)}]")
        elif value is not None:
            given.append(f"{name}={value}")
    return load_config(schema, args.config, [*given, *args.overrides])


def _cmd_collect(args: argparse.Namespace) -> int:
    from embodied.apps.collect import CollectConfig, CollectInterrupted, run_collect

    flags = ("task", "policy", "episodes", "out", "noise", "seed", "workers", "cutoff", "rewind")
    try:
        summary = run_collect(_config(CollectConfig, args, flags))
    except CollectInterrupted as stop:  # Ctrl-C: the finished episodes were committed
        print(f"embodied collect: {stop.line()}", file=sys.stderr)
        return 130
    # Every episode is committed: a Ctrl-C now would only cut the summary, and turn a complete
    # run into an "interrupted" one. (signal.signal directly: a Python call could raise first.)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        print(summary.line())
    finally:
        signal.signal(signal.SIGINT, previous)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from embodied.evaluation.report import eval_table, markdown_table
    from embodied.evaluation.suite import EvalConfig, run_eval

    flags = ("policy", "suite", "tasks", "episodes", "seed", "videos", "workers", "envs", "out",
             "record")  # fmt: skip
    echo = partial(print, file=sys.stderr, flush=True)  # stdout keeps just the table
    run, results = run_eval(_config(EvalConfig, args, flags), echo=echo)
    print(markdown_table(*eval_table(results)))
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
        warnings = validate_dataset(args.dataset, quick=args.quick)
    except DatasetError as error:
        print(f"invalid dataset {args.dataset}: {error}", file=sys.stderr)
        return 1
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"{args.dataset}: valid LeRobot v3.0 dataset")
    return 0


# `embodied train NAME`: help, the job's module, its config class and train function, what the
# run saves, and an example override.
TRAINERS = {
    "bc": ("behaviour cloning from a LeRobot v3 dataset", "embodied.train.bc", "BCConfig",
           "train_bc", "policy", "steps=2000"),
    "reward": ("progress reward model from a labelled dataset", "embodied.train.reward",
               "RewardTrainConfig", "train_reward", "model", "model.d_model=128"),
    "grpo": ("trajectory-level GRPO from a saved policy", "embodied.train.grpo", "GRPOConfig",
             "train_grpo", "policy", "group_size=8"),
    "tpo": ("trajectory preference optimisation (GRAPE's TPO)", "embodied.train.tpo",
            "TPOConfig", "train_tpo", "policy", "objective=safety"),
}  # fmt: skip


def _cmd_train(args: argparse.Namespace) -> int:
    """``embodied train NAME``: config file + overrides (+ ``--resume``), train, print where the
    result was saved."""
    import importlib

    from embodied.core.config import load_config

    _, module, config_class, train, saved, _ = TRAINERS[args.algorithm]
    job = importlib.import_module(module)
    overrides = list(args.overrides) + ([f"resume={args.resume}"] if args.resume else [])
    run = getattr(job, train)(load_config(getattr(job, config_class), args.config, overrides))
    print(f"{saved}: {run.path / saved}")
    return 0


def _cmd_average(args: argparse.Namespace) -> int:
    from embodied.train.averaging import average_run

    folder, steps = average_run(args.run, args.first, args.last, args.out)
    print(f"policy: {folder} (the mean of {len(steps)} checkpoints, steps {steps[0]}..{steps[-1]})")
    return 0


def _cmd_tasks(args: argparse.Namespace) -> int:
    import embodied.sims as sims

    for name in sims.list_tasks(args.suite):
        print(name)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from embodied.apps import bench

    def note(what: str) -> None:  # progress lines on stderr (none with JSON output)
        print(f"benchmarking {what} ...", file=sys.stderr, flush=True)

    print(bench.run(args, None if args.json else note))
    return 0


def build_parser(benches: bool = True) -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and documentation); ``benches=False`` leaves the
    ``bench`` targets out, whose modules import torch and the simulators (seconds at start)."""
    parser = argparse.ArgumentParser(
        prog="embodied",
        description="Embodied and vision-language trajectory learning toolkit.",
    )
    parser.add_argument("--version", action="version", version=f"embodied {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (EMBODIED_DEBUG=1)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        "demo",
        help="the whole pipeline: demos, reward model, BC, GRPO, before/after report",
    )
    demo.add_argument(
        "config", nargs="?", default=None, help="YAML config (default: the built-in recipe)"
    )
    demo.add_argument("overrides", nargs="*", help="dotted overrides, e.g. grpo.iterations=30")
    demo.add_argument("--out", default=None, help="root directory for the run (default: runs)")
    demo.add_argument(
        "--quick", action="store_true", help="toy sizes: the same pipeline in a few minutes"
    )
    demo.add_argument(
        "--state",
        action="store_true",
        help="the planner reads the simulator's object state instead of the front camera",
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
    ev.add_argument(
        "--workers", type=int, help="processes: a sub-env each, or with --envs a task each"
    )
    ev.add_argument("--envs", type=int, help="a task's sub-envs in one process, one policy call")
    ev.add_argument("--record", help="LeRobot dataset to write (or append) every episode to")
    ev.add_argument("--out", help="root directory of the run")
    ev.set_defaults(func=_cmd_eval)

    ev_reward = sub.add_parser(
        "eval-reward", help="VOC, AUROC, MAE, calibration of a reward model (also: eval reward)"
    )
    ev_reward.add_argument(
        "--model",
        required=True,
        help="reward model dir, 'time', 'privileged', 'success' or judge:DIR",
    )
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
    validate = dataset_sub.add_parser(
        "validate", help="check everything training reads; exit 1 naming the file at fault"
    )
    validate.add_argument("dataset")
    validate.add_argument(
        "--quick", action="store_true", help="read video headers only, not every frame"
    )
    validate.set_defaults(func=_cmd_dataset_validate)

    train = sub.add_parser("train", help="train a policy or a reward model")
    train_sub = train.add_subparsers(dest="algorithm", metavar="ALGORITHM", required=True)
    for name, (summary, _, config_class, _, _, example) in TRAINERS.items():
        job = train_sub.add_parser(name, help=summary)
        job.add_argument("config", nargs="?", default=None, help=f"YAML config ({config_class})")
        job.add_argument("overrides", nargs="*", help=f"dotted overrides, e.g. {example}")
        job.add_argument("--resume", default=None, help="run directory to continue exactly")
        job.set_defaults(func=_cmd_train)

    average = sub.add_parser(
        "average", help="a policy that is the mean of a run's checkpoints (weight averaging)"
    )
    average.add_argument("run", help="run directory whose checkpoints/ hold policies")
    average.add_argument("--first", type=int, default=1, help="first step averaged (default 1)")
    average.add_argument("--last", type=int, default=None, help="last step (default: the newest)")
    average.add_argument("--out", default=None, help="policy folder (RUN/policy-average-A-B)")
    average.set_defaults(func=_cmd_average)

    tasks = sub.add_parser("tasks", help="list the tasks of a suite")
    tasks.add_argument("--suite", default="tabletop", choices=["tabletop", "metaworld"])
    tasks.set_defaults(func=_cmd_tasks)

    bench = sub.add_parser("bench", help="speed benchmarks with in-run baselines")
    bench_sub = bench.add_subparsers(dest="target", metavar="TARGET", required=True)
    if benches:
        from embodied.apps.bench import add_parsers  # imports torch: only for `embodied bench`

        add_parsers(bench_sub)
    bench.set_defaults(func=_cmd_bench)
    return parser


# What a user's mistake or a failing machine raises (bad values, files, disk, a diverging run):
# one line, no traceback. Anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, OSError, FloatingPointError, RuntimeError)


def _one_line_warnings(command: str) -> Any:
    """``warnings.showwarning`` for the CLI: ``embodied <command>: warning: <what>`` on one line,
    instead of Python's two (the source file and the line that warned)."""

    def show(message: Warning | str, *_: Any, **__: Any) -> None:
        print(f"embodied {command}: warning: {' '.join(str(message).split())}", file=sys.stderr)

    return show


@contextlib.contextmanager
def _ctrl_c_outside_finalisers() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt in the command, never inside an object's ``__del__`` (a
    progress bar being collected, say): Python cannot raise out of a finaliser, so it would print
    "Exception ignored ... Traceback" and drop the interrupt. There it waits for the finaliser to
    return. A SIGINT that is ignored or handled by someone else is left alone."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        while frame is not None:
            if frame.f_code.co_name == "__del__":  # this handler again, in 10 ms
                threading.Timer(0.01, _thread.interrupt_main).start()
                return
            frame = frame.f_back
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _gather_overrides(parser: argparse.ArgumentParser, args: Any, extra: list[str]) -> None:
    """``key=value`` words are overrides wherever argparse put them: in the config's place
    (``embodied train bc key=value``), among a list flag's values (``--tasks A B name=x``) or
    past the flags (``--out DIR name=x``, left over as ``extra``); anything else left over is
    refused as argparse would."""
    if extra and not (hasattr(args, "overrides") and all("=" in a and a[0] != "-" for a in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not hasattr(args, "overrides"):
        return
    first = []
    if getattr(args, "config", None) and "=" in args.config:
        first, args.config = [args.config], None
    later = []
    for name, value in vars(args).items():
        if isinstance(value, list) and name != "overrides":
            later += [v for v in value if "=" in v]
            setattr(args, name, [v for v in value if "=" not in v])
    args.overrides = [*first, *args.overrides, *later, *extra]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``embodied`` console script. An expected failure is one line,
    ``embodied <command>: error: <what>``, and exit status 2; ``--debug`` (or
    ``EMBODIED_DEBUG=1``) shows the traceback; Ctrl-C exits 130 (once the command has returned,
    it is ignored: its work is done) and a closed pipe quietly.
    Warnings are one line too (``embodied <command>: warning: <what>``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("EMBODIED_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser(benches="bench" in argv[:1])
    if argv[:2] == ["eval", "reward"]:  # `embodied eval reward ...` is the reward evaluation
        argv = ["eval-reward", *argv[2:]]
    args, extra = parser.parse_known_args(argv)
    _gather_overrides(parser, args, extra)
    keep_freed_memory()  # glibc: reuse freed tensor buffers instead of page-faulting them in
    words = [args.command.replace("-", " ")]  # eval-reward is typed `eval reward`
    words += [getattr(args, k) for k in ("algorithm", "target") if getattr(args, k, None)]
    command = " ".join(words)
    code = None
    try:
        with warnings.catch_warnings(), _ctrl_c_outside_finalisers():  # both undone at the end
            if not debug:
                warnings.showwarning = _one_line_warnings(command)
            code = args.func(args)
        return code
    except BrokenPipeError:  # `embodied dataset info | head`: the reader left, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        if code is not None:  # once the command had returned, as the settings were put back
            return code
        if debug:
            raise
        print(f"embodied {command}: interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as error:
        if debug:
            raise
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"embodied {command}: error: {message}", file=sys.stderr)
        return 2


def run(argv: Sequence[str] | None = None) -> None:
    """The console script: ``main``, then exit with its status. A Ctrl-C that comes once the
    command has finished (while Python shuts down) is ignored: the work is done and saved, and
    it would otherwise print a traceback or end the process by the signal."""
    code = main(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":
    run()
