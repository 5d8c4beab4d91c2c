"""``python -m agent.ledger RUN_DIR ...``: write and print what runs cost (the arithmetic, and its names for a notebook:
agent/rundir/ledger.py).

    python -m agent.ledger RUN_DIR [RUN_DIR ...] [--prices prices.json] [--serve-dir DIR] [--gpus-per-server N]
"""
from __future__ import annotations

import json
import logging
import sys

from .cli import done, make_parser, positive_int

log = logging.getLogger(__name__)

__all__ = ["main"]

LEDGER_DOC = """What a run cost: tokens and GPU-seconds per model, paid and cached tool calls per tool API, the judges' tokens,
and money from a price table (ours; issue 26)."""


def main(argv=None) -> int:
    ap = make_parser("python -m agent.ledger", LEDGER_DOC, [
        "python -m agent.ledger runs/react-27b", "python -m agent.ledger runs/* --prices prices.json"])
    ap.add_argument("run_dirs", nargs="+", help="run directories of python -m agent.run")
    ap.add_argument("--prices", help="a price table (JSON, DEFAULT_PRICES' layout) merged over the defaults")
    ap.add_argument("--serve-dir", dest="serving_dir", help="the launcher's --serve-dir whose endpoints.json names the GPUs")
    ap.add_argument("--gpus-per-server", type=positive_int, help="GPUs behind each endpoint (instead of endpoints.json)")
    ap.add_argument("--json", action="store_true", help="print the ledgers as JSON")
    a = ap.parse_args(argv)
    # the arithmetic loads once the arguments parse (--help needs the standard library only)
    from .rundir.common import RunError  # noqa: PLC0415
    from .rundir.ledger import format_ledger, load_prices, write_ledger  # noqa: PLC0415

    try:
        prices = load_prices(a.prices)
        leds = [write_ledger(d, prices=prices, serving_dir=a.serving_dir, gpus_per_server=a.gpus_per_server)
                for d in a.run_dirs]
    except (ValueError, OSError) as e:
        log.error(f"error: {e}")
        return 2
    except RunError as e:  # a run directory that cannot be read: named
        log.error(f"error: {e}")
        return 2
    if a.json:
        print(json.dumps(leds, indent=2))
    else:
        for led in leds:
            print("\n".join(format_ledger(led)))
    done([f"{d}/ledger.json" for d in a.run_dirs], "python -m analysis.report --runs " + " ".join(a.run_dirs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
