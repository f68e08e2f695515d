"""The ``embodied`` command line: one console script with subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from embodied import __version__


def _cmd_demo(args: argparse.Namespace) -> int:
    from embodied.config import load_config
    from embodied.demo import DemoConfig, markdown_table, run_demo

    overrides = list(args.overrides) + ([f"out={args.out}"] if args.out else [])
    cfg = load_config(DemoConfig, args.config, overrides)
    run, results = run_demo(cfg)
    print(markdown_table(results))
    print(f"\nreport: {run.path / 'report.html'}")
    return 0


def _cmd_tasks(args: argparse.Namespace) -> int:
    import embodied.sims as sims

    for name in sims.list_tasks(args.suite):
        print(name)
    return 0


def _cmd_bench_sim(args: argparse.Namespace) -> int:
    from embodied.bench import bench_sim, format_table

    def note(what: str) -> None:
        print(f"benchmarking {what} ...", file=sys.stderr, flush=True)

    rows = bench_sim(
        tasks=args.tasks,
        resolutions=tuple(args.resolutions),
        steps=args.steps,
        repeats=args.repeats,
        metaworld=not args.no_metaworld,
        progress=None if args.json else note,
    )
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        print(format_table(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and documentation)."""
    parser = argparse.ArgumentParser(
        prog="embodied",
        description="Embodied and vision-language trajectory learning toolkit.",
    )
    parser.add_argument("--version", action="version", version=f"embodied {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser("demo", help="roll out the scripted experts on the tabletop suite")
    demo.add_argument("config", nargs="?", default=None, help="YAML config (configs/demo.yaml)")
    demo.add_argument("overrides", nargs="*", help="dotted overrides, e.g. episodes=20")
    demo.add_argument("--out", default=None, help="root directory for the run (default: runs)")
    demo.set_defaults(func=_cmd_demo)

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
    sim.add_argument("--no-metaworld", action="store_true", help="skip Meta-World rows")
    sim.set_defaults(func=_cmd_bench_sim)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``embodied`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo" and args.config and "=" in args.config:
        args.overrides, args.config = [args.config, *args.overrides], None
    try:
        return args.func(args)
    except ValueError as error:  # bad input: a clear message, no traceback
        print(f"embodied {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
