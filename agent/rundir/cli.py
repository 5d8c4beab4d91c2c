"""``python -m agent.rundir``: the run-directory tools' command line (check, export, merge, schema).

    python -m agent.rundir check RUN_DIR [--repair] [--json]
    python -m agent.rundir export RUN_DIR OUT
    python -m agent.rundir merge OUT SHARD_DIR...
    python -m agent.rundir schema --out DIR

The flags of all four are here; each tool's module loads once they parse (``--help`` and a usage error need the
standard library only).
"""
from __future__ import annotations

import sys

from ..cli import HelpFormatter, make_parser

__all__ = ["main"]

EXPORT_DOC = "``python -m agent.rundir export RUN OUT``: a run as plain Parquet tables with a dataset card."
MERGE_DOC = "Shards of one run, and merging them back into one run directory (ours; issue 26)."
SCHEMA_DOC = "``python -m agent.rundir schema --out DIR``: the run record's JSON Schemas, one file per record kind."


def _check_parser():
    ap = make_parser("python -m agent.rundir", "Run-directory tools: check a run, export it, merge shards.",
                     ["python -m agent.rundir check runs/react-27b", "python -m agent.rundir check runs/react-27b --repair"])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="is this run complete and intact? (exit 0 only when it is)",
                       formatter_class=HelpFormatter,
                       description="Units expected vs present, duplicates, torn lines, sidecars against their calls, "
                                   "orphaned and temporary files, missing images, the tool cache's integrity.",
                       epilog="examples:\n  python -m agent.rundir check runs/react-27b\n"
                              "  python -m agent.rundir check runs/react-27b --repair --json")
    c.add_argument("run_dir", help="a run directory of python -m agent.run")
    c.add_argument("--repair", action="store_true",
                   help="move torn lines and orphaned files into RUN_DIR/quarantine/ (never deleted), remove temp files")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    sub.add_parser("export", help="a run as plain Parquet tables with a dataset card: "
                                  "python -m agent.rundir export RUN_DIR OUT")
    sub.add_parser("schema", help="write the run record's JSON Schemas, one per record kind: "
                                  "python -m agent.rundir schema --out DIR")
    sub.add_parser("merge", help="merge the shards of a run (agent.run --shard I/N) into one run directory: "
                                 "python -m agent.rundir merge OUT SHARD_DIR... (--help: its own)")
    return ap


def _export_parser():
    ap = make_parser("python -m agent.rundir export", EXPORT_DOC,
                     ["python -m agent.rundir export runs/react-27b exports/react-27b"])
    ap.add_argument("run_dir", help="a run directory of python -m agent.run")
    ap.add_argument("out", help="a new directory for the tables and the card")
    return ap


def _merge_parser():
    ap = make_parser("python -m agent.rundir merge", MERGE_DOC,
                     ["python -m agent.rundir merge runs/react-27b runs/react-27b-shard*"])
    ap.add_argument("out", help="the merged run directory (new)")
    ap.add_argument("shards", nargs="+", help="the shard directories (python -m agent.run … --shard I/N)")
    return ap


def _schema_parser():
    ap = make_parser("python -m agent.rundir schema", SCHEMA_DOC, ["python -m agent.rundir schema --out schemas/"])
    ap.add_argument("--out", required=True, metavar="DIR", help="the directory to write the schemas into")
    return ap


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    tool = args[0] if args[:1] and args[0] in ("export", "merge", "schema") else "check"
    # each tool's work loads once its arguments parse
    if tool == "export":
        a = _export_parser().parse_args(args[1:])
        from .export import export_command  # noqa: PLC0415
        return export_command(a)
    if tool == "merge":
        a = _merge_parser().parse_args(args[1:])
        from .merge import merge_command  # noqa: PLC0415
        return merge_command(a)
    if tool == "schema":
        a = _schema_parser().parse_args(args[1:])
        from .schema import schema_command  # noqa: PLC0415
        return schema_command(a)
    a = _check_parser().parse_args(args)
    from .check import check_command  # noqa: PLC0415
    return check_command(a)
