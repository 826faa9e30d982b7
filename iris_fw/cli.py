"""The ``iris-fw`` command."""

from __future__ import annotations

import argparse
import sys


def _cmd_plugins(args) -> int:
    from .registry import load_registries

    regs = load_registries()
    for registry in regs:
        print(f"{registry.kind}s:")
        if not len(registry):
            print("  (none registered)")
        width = max((len(e.name) for e in registry), default=0)
        for entry in registry:
            ok, reason = entry.availability()
            state = "available" if ok else f"unavailable: {reason}"
            print(f"  {entry.name:<{width}}  {state}  [{entry.provider}]")
    return 0


def _cmd_env(args) -> int:
    from . import env

    if args.markdown:
        print(env.markdown_table(), end="")
        return 0
    values = env.in_effect()
    for var in env.VARIABLES:
        shown = f"{values[var.name]!r}" if var.name in values else f"{var.default_text} (default)"
        print(f"{var.name:<24} {shown}")
    for name in env.unknown():
        print(f"{name:<24} unknown to iris-fw (a typo?)")
    return 0


def _cmd_launch(args) -> int:
    from .launch import default_world_size, launch

    if not args.program:
        what = "a module, e.g. iris-fw launch -m mypkg.train" if args.module else \
            "a program, e.g. iris-fw launch examples/ring_exchange.py"
        print(f"iris-fw launch: name {what}", file=sys.stderr)
        return 2
    nprocs = args.nprocs if args.nprocs is not None else default_world_size()
    return launch(args.program, nprocs, timeout=args.timeout, module=args.module, tag_output=args.tag_output)


def _cmd_info(args) -> int:
    import json

    from .info import format_report, report

    data = report()
    print(json.dumps(data, indent=1) if args.json else format_report(data))
    return 0


def _cmd_run(args) -> int:
    """``iris-fw run [--as-iris] [-n N] program.py|-m module [args…]``: run it here (under
    torchrun/mpirun: as this rank), or as N ranks on this host with ``-n``."""
    if not args.program:
        print("iris-fw run: name a program, e.g. iris-fw run --as-iris program.py", file=sys.stderr)
        return 2
    if args.nprocs is not None:
        from .launch import launch

        return launch((["-m", "iris_fw.compat.run"] if args.as_iris else []) + args.program, args.nprocs,
                      timeout=args.timeout)
    from .compat.run import main as run_as_iris, run_program

    return run_as_iris(args.program) if args.as_iris else run_program(args.program)


def _split_run(argv: list[str]) -> tuple[list[str], list[str]]:
    """``iris-fw run``'s own options and the program (from its path or ``-m``; its arguments
    are the program's even where they look like ours)."""
    i, takes_value = 1, ("-n", "--nprocs", "--timeout")
    while i < len(argv) and argv[i] != "-m" and argv[i].startswith("-"):
        i += 2 if argv[i] in takes_value else 1
    return argv[:i], argv[i:]


def main(argv: list[str] | None = None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(prog="iris-fw", description="iris-fw: fine-grained multi-GPU programming in Triton")
    parser.add_argument("--version", action="version", version=f"iris-fw {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="versions, GPUs, interpreter, what init() would choose and why, mpirun, "
                                    "/dev/shm, plugins and their load errors, environment variables")
    p.add_argument("--json", action="store_true", help="print the report as JSON (for bug reports)")
    p.set_defaults(func=_cmd_info)
    p = sub.add_parser("plugins", help="list transports, bootstraps, schedulers, patterns and benchmarks, with availability")
    p.set_defaults(func=_cmd_plugins)
    p = sub.add_parser("env", help="the IRIS_FW_* environment variables: values in effect, or --markdown for the table")
    p.add_argument("--markdown", action="store_true", help="print the table of every variable (docs/environment.md)")
    p.set_defaults(func=_cmd_env)
    p = sub.add_parser("launch", help="run a Python program as N ranks on this host (CPU ranks when no GPU is present)")
    p.add_argument("-n", "--nprocs", type=int, default=None, help="number of ranks (default: GPUs present, else 4)")
    p.add_argument("--timeout", type=float, default=None, help="stop the job after this many seconds")
    p.add_argument("-m", "--module", action="store_true",
                   help="run the program as a module, like python -m (iris-fw launch -m pkg.mod args...)")
    p.add_argument("--tag-output", action=argparse.BooleanOptionalAction, default=None,
                   help="prefix every output line with [rank N] (default: on with more than one rank)")
    p.add_argument("program", nargs=argparse.REMAINDER, help="script.py [args...], or module [args...] with -m")
    p.set_defaults(func=_cmd_launch)
    p = sub.add_parser("run", help="run a Python program (-n: as N ranks on this host); --as-iris: programs written "
                                   "for AMD Iris, unchanged (`iris` is iris-fw's compat layer)")
    p.add_argument("--as-iris", action="store_true", help="map `import iris` / `iris.*` to iris_fw.compat.iris")
    p.add_argument("-n", "--nprocs", type=int, default=None, help="start this many ranks on this host")
    p.add_argument("--timeout", type=float, default=None, help="with -n: stop the job after this many seconds")
    p.add_argument("program", nargs=argparse.REMAINDER, help="program.py [args...] or -m module [args...]")
    p.set_defaults(func=_cmd_run)
    sub.add_parser("bench", help="run benchmarks on N ranks (see iris-fw bench --help)", add_help=False)
    from .trace_report import add_parser as add_trace_parser

    add_trace_parser(sub)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # everything after it belongs to the bench's own parser
        from .bench import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["run"]:
        own, program = _split_run(argv)
        args = parser.parse_args(own)
        args.program = program
        return args.func(args)
    args = parser.parse_args(argv)
    from .errors import ArgumentError

    try:
        return args.func(args)
    except ArgumentError as exc:  # bad input (a flag, an environment variable): the message, no traceback
        print(f"iris-fw {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
