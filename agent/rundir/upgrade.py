"""``python -m agent.rundir upgrade RUN``: rewrite a run's token sidecars of formats 1 and 2 as plain Parquet.

Every sidecar the run's lines name is read with the toolkit's decoder and written again as format 3
(agent/rundir/sidecar.py) under a temporary name, checked to read back to the same arrays, then renamed into
place, so an interrupted upgrade leaves each file either old or new and a rerun finishes the rest. The prompt
pieces in a file's metadata are carried over. Runs read the same before and after; only other tools' view
changes (they now see every value as itself).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..cli import done, make_parser
from .common import RunError, _tmp_name
from .sidecar import decode, read_prompt_pieces, sidecar_format, table_of_arrays, write_table
from .writer import RunDir

__all__ = ["upgrade_run", "Upgrade"]


@dataclass
class Upgrade:
    upgraded: int = 0
    current: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


def _same(a: dict, b: dict) -> bool:
    """Every array of ``a`` (the old file's) equal in ``b`` (the new file may add a format-1 file's missing
    optional columns, empty)."""
    if not set(a) <= set(b):
        return False
    for name, x in a.items():
        y = b[name]
        if x.dtype.kind == "f":
            if not np.array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32), equal_nan=True):
                return False
        elif not np.array_equal(x, y):
            return False
    return True


def upgrade_file(path: Path) -> int:
    """Rewrite one sidecar as format 3; its new size in bytes."""
    arrays = decode(path)
    fingerprint, pieces = read_prompt_pieces(path)
    data = write_table(table_of_arrays(arrays), (fingerprint, pieces) if pieces else None)
    tmp = _tmp_name(path)
    tmp.write_bytes(data)
    try:
        again = decode(tmp)
        if not _same({n: a for n, a in arrays.items() if n != "chosen"}, again):
            raise RunError(f"{path}: the rewritten sidecar does not read back to the same arrays; left as it was")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return len(data)


def upgrade_run(run_dir) -> Upgrade:
    """Upgrade every sidecar of ``run_dir`` (under the run lock: no runner may write meanwhile)."""
    rd = RunDir(run_dir)
    if not (rd.path / "header.json").is_file():
        raise RunError(f"{run_dir}: not a run directory (no header.json)")
    out = Upgrade()
    rd.lock(wait_s=0.5)
    try:
        for path in sorted((rd.path / "tokens").glob("*.parquet")):
            try:
                fmt = sidecar_format(path)
            except (OSError, ValueError) as e:  # an unreadable file: named; a rerun after repair does the rest
                raise RunError(f"{path}: not a readable Parquet file ({e}); python -m agent.rundir check "
                               f"{run_dir} --repair quarantines it") from None
            if fmt >= 3:
                out.current += 1
                continue
            before = path.stat().st_size
            after = upgrade_file(path)
            out.upgraded += 1
            out.bytes_before += before
            out.bytes_after += after
    finally:
        rd.unlock()
    return out


def main(argv=None) -> int:
    ap = make_parser("python -m agent.rundir upgrade", __doc__, ["python -m agent.rundir upgrade runs/react-27b"])
    ap.add_argument("run_dir", help="a run directory of python -m agent.run")
    a = ap.parse_args(argv)
    try:
        up = upgrade_run(a.run_dir)
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if up.upgraded:
        print(f"{a.run_dir}: {up.upgraded} sidecar(s) rewritten as plain Parquet ({up.bytes_before:,} -> "
              f"{up.bytes_after:,} bytes); {up.current} already were")
    else:
        print(f"{a.run_dir}: all {up.current} sidecar(s) already plain Parquet; nothing to do")
    done([], f"python -m agent.rundir check {a.run_dir}")
    return 0
