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


def _cmd_launch(args) -> int:
    from .launch import default_world_size, launch

    if not args.program:
        print("iris-fw launch: name a program, e.g. iris-fw launch examples/ring_exchange.py", file=sys.stderr)
        return 2
    nprocs = args.nprocs if args.nprocs is not None else default_world_size()
    return launch(args.program, nprocs, timeout=args.timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iris-fw", description="iris-fw: fine-grained multi-GPU programming in Triton")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugins", help="list transports, bootstraps, schedulers, patterns and benchmarks, with availability")
    p.set_defaults(func=_cmd_plugins)
    p = sub.add_parser("launch", help="run a Python program as N ranks on this host (CPU ranks when no GPU is present)")
    p.add_argument("-n", "--nprocs", type=int, default=None, help="number of ranks (default: GPUs present, else 4)")
    p.add_argument("--timeout", type=float, default=None, help="stop the job after this many seconds")
    p.add_argument("program", nargs=argparse.REMAINDER, help="script.py [args...]")
    p.set_defaults(func=_cmd_launch)
    sub.add_parser("bench", help="run benchmarks on N ranks (see iris-fw bench --help)", add_help=False)
    from .trace_report import add_parser as add_trace_parser

    add_trace_parser(sub)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # everything after it belongs to the bench's own parser
        from .bench import main as bench_main

        return bench_main(argv[1:])
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
