"""The ``hal`` command: ``hal backends``, ``hal collectives``, ``hal schema`` (more subcommands register here).

Exit codes: 0 success; 1 a check ran and failed (``hal collectives``); 2 bad input or usage (one
``hal: error: ...`` line on stderr, never a usage block); 4 internal error (one line); 130
interrupted; 143 terminated (SIGTERM; child processes killed first). Every numeric option is checked (finite, in range) before anything runs.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from tabulate import tabulate

from hal.cli.registry import SUBCOMMANDS, subcommand
from hal.commandline import CliError, Parser, add_format, add_version, check_number, emit, run_cli

def _cfg_backends(p: argparse.ArgumentParser) -> None:
    add_format(p)
    p.add_argument("--probe-timeout", type=float, metavar="SEC",
                   help="bound on each third-party plugin's probe, in seconds (default: $HAL_PROBE_TIMEOUT or 10)")
    p.add_argument("--refresh", action="store_true",
                   help="probe every third-party plugin again instead of using cached results")


@subcommand("backends", "list installed backend plugins, their availability and devices")(_cfg_backends)
def cmd_backends(args: argparse.Namespace) -> int:
    import os

    import hal
    from hal import plugin_probe
    check_number("--probe-timeout", args.probe_timeout, above=0, maximum=3600, what="a number of seconds")
    if args.probe_timeout is not None:
        os.environ[plugin_probe.ENV_TIMEOUT] = repr(args.probe_timeout)
    if args.refresh:
        plugin_probe.clear_cache()
        hal.refresh()
    rows = []
    for info in hal.list_backends():
        rows.append({"name": info.name, "available": info.available, "reason": info.reason,
                     "priority": info.priority, "target": info.target, "distribution": info.distribution,
                     "version": info.version, "isolated": info.isolated, "devices": info.devices(),
                     "versions": info.versions(), "collisions": list(info.collisions)})
    if args.format == "json":
        emit(json.dumps({"backends": rows}, indent=2, default=str))
    else:
        table = [[r["name"], "yes" if r["available"] else "no", r["priority"], len(r["devices"]),
                  r["distribution"], one_line_cell(r["reason"])] for r in rows]
        emit(tabulate(table, headers=["backend", "available", "priority", "devices", "distribution", "reason"]))
        for r in rows:
            for note in r["collisions"]:
                emit(f"warning: {one_line_cell(note)}")
    return 0


def one_line_cell(text: str, limit: int = 160) -> str:
    """A table cell: control characters removed, whitespace collapsed, at most ``limit`` characters."""
    text = " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


MAX_WORLD_SIZE = 1024
#: what ``hal collectives`` checks by default: hal.testing.collectives.DTYPES, spelled out here so that
#: ``hal --help`` need not import torch (tests/test_cli_surface.py checks that the two agree)
COLLECTIVE_DTYPES = "float32,bfloat16,float16,int64"
MAX_TIMEOUT_S = 1e6


def _cfg_collectives(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="backend name (default: cpu)")
    p.add_argument("--world-size", type=int, default=2, help="number of processes (default: 2)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds a collective may wait for peers (default: 120)")
    p.add_argument("--dtypes", default=None, help=f"comma-separated dtypes to check (default: {COLLECTIVE_DTYPES})")
    add_format(p)


@subcommand("collectives", "run every collective in N real processes and check results exactly")(_cfg_collectives)
def cmd_collectives(args: argparse.Namespace) -> int:
    import hal
    from hal.testing import collectives
    if args.world_size < 1:
        raise CliError("--world-size must be at least 1")
    check_number("--world-size", args.world_size, minimum=1, maximum=MAX_WORLD_SIZE, what="an integer")
    check_number("--timeout", args.timeout, above=0, maximum=MAX_TIMEOUT_S, what="a number of seconds")
    spec = COLLECTIVE_DTYPES if args.dtypes is None else args.dtypes
    dtypes = tuple(d.strip() for d in spec.split(",") if d.strip())
    if not dtypes:
        raise CliError(f"--dtypes must name at least one dtype ({', '.join(collectives.DTYPES)}), not {args.dtypes!r}")
    for d in dtypes:
        if d not in collectives.DTYPES:
            raise CliError(f"unknown dtype {d!r}; one of {', '.join(collectives.DTYPES)}")
    try:
        hal.get_backend(args.device)
    except hal.BackendUnavailableError as exc:
        raise CliError(str(exc)) from None
    rows = collectives.run(args.device, args.world_size, args.timeout, dtypes)
    failed = [r for r in rows if r.status == "fail"]
    if args.format == "json":
        emit(json.dumps({"device": args.device, "world_size": args.world_size,
                         "passed": not failed, "rows": [r.as_dict() for r in rows]}, indent=2))
    else:
        emit(tabulate([[r.collective, r.dtype, r.op, r.status, f"{r.max_error:g}", f"{r.seconds * 1e3:.2f}", r.detail]
                       for r in rows], headers=["collective", "dtype", "op", "status", "max_error", "ms", "detail"]))
        emit(f"{len(rows) - len(failed)} passed, {len(failed)} failed on {args.device} x{args.world_size}")
    return 1 if failed else 0


def _cfg_schema(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", metavar="NAME",
                   help="a schema name such as hal-audit/1 (default: list the names)")


@subcommand("schema", "list the published JSON Schemas, or print one (hal schema hal-audit/1)")(_cfg_schema)
def cmd_schema(args: argparse.Namespace) -> int:
    """No NAME: one line per shipped schema (name, title). NAME: the schema's JSON text as shipped.
    An unknown NAME is bad input (exit 2, one line naming the known ones)."""
    from hal import schemas
    if args.name is None:
        rows = [[n, json.loads(schemas.text(n)).get("title", "").split(": ", 1)[-1]] for n in schemas.names()]
        emit(tabulate(rows, headers=["schema", "what"]))
        return 0
    try:
        emit(schemas.text(args.name).rstrip("\n"))
    except schemas.UnknownSchemaError as exc:
        raise CliError(str(exc)) from None
    return 0


def build_parser() -> argparse.ArgumentParser:
    _load_plugins()
    parser = Parser(prog="hal", description="HAL: hardware abstraction and portability for PyTorch",
                    epilog="`hal audit TARGET ...` is the migration auditor, the same as `hal-audit` "
                           "(see `hal audit --help`). Exit codes: 0 done; 1 a check ran and failed; 2 bad input "
                           "or usage; 3 an audited program failed or a requested section could not be produced; "
                           "4 internal error; 130 interrupted; 143 terminated (SIGTERM).")
    add_version(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("audit", help="the migration auditor: the same as hal-audit (hal audit --help)",
                   add_help=False)
    sub.required = True
    for name, (configure, handler, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        configure(p)
        p.set_defaults(handler=handler)
    return parser


def _load_plugins() -> None:
    """Import the modules that add subcommands (they register on import)."""
    import importlib
    for mod in ("hal.cli.matrix",):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                raise


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["audit"]:  # `hal audit ...` is `hal-audit ...`, options, exit codes and all
        from hal.cli import audit
        return audit.main(argv[1:], prog="hal audit")
    return run_cli(lambda: build_parser().parse_args(argv), lambda a: a.handler(a), prog="hal")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
