"""The entropy probe's command with its parts timed (for scripts/bench_probe_http.py; ours).

    python scripts/_probe_parts.py PARTS.json RUN [probes.entropy arguments...]

Runs ``python -m probes.entropy RUN ...`` unchanged in this process, with the functions that do each part of a
probed step wrapped to add up their CPU time (``time.process_time``; two clock reads per call, ~1 µs, on ~20
calls a step). Only functions that never await are wrapped: the process's CPU clock would charge a coroutine with
whatever other requests did while it waited (HTTP is what is left over). At exit it writes the sums and call counts to PARTS.json. The bench runs it at two scales and
takes the difference, so constant costs (imports, the fidelity check, the figures) drop out and each part is
given per step; what no part covers is "the rest".
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: (part, object path, attribute); each a plain function (never a coroutine)
WRAPPED = (
    ("render", "agent.backends.sglang_native:SGLangBackend", "render"),
    ("tokenise", "agent.backends.sglang_native:SGLangBackend", "prompt_pieces"),
    ("body", "agent.http", "dumps"),
    ("decode", "agent.backends.sglang_native", "decode_generate_reply"),
    ("arrays", "agent.backends.sglang_native:SGLangBackend", "parse_score"),
    ("influence", "probes.entropy", "token_influence"),
    ("alternatives", "probes.entropy", "_alternatives"),
    ("line_read", "agent.rundir.reader:Run", "full"),
    ("sidecar_read", "agent.rundir.reader:Run", "tokens"),
    ("token_store", "probes.entropy:TokenStore", "append"),
    ("token_store", "probes.entropy:TokenStore", "commit"),
    ("messages", "agent.rundir.reader:Run", "sendable_messages"),
    ("messages", "probes.entropy", "strip_query_images"),
    ("records", "agent.backends.sglang_native", "record_messages"),
    ("records", "agent.backends.sglang_native", "mark_think"),
    ("histograms", "probes.entropy", "entropy_histogram"),
    ("collector", "probes.entropy", "collect_cycles"),
)


def install(acc: dict, calls: dict) -> None:
    """Wrap every function of :data:`WRAPPED` (and glibc's heap trim). Every module is imported first, so a module
    that imports a wrapped name (``from agent.http import dumps``) keeps the unwrapped one and is not counted."""
    import importlib

    import agent.rundir.common as common

    def timed(f, part):
        def g(*a, **k):
            t = time.process_time()
            try:
                return f(*a, **k)
            finally:
                acc[part] += time.process_time() - t
                calls[part] += 1
        return g

    targets = []
    for part, where, name in WRAPPED:
        mod, _, cls = where.partition(":")
        obj = importlib.import_module(mod)
        targets.append((part, getattr(obj, cls) if cls else obj, name))
    if common._TRIM is not None:  # glibc's malloc_trim, inside the collector's part: timed on its own too
        acc["trim"], calls["trim"] = 0.0, 0
        common._TRIM = timed(common._TRIM, "trim")
    for part, obj, name in targets:
        acc.setdefault(part, 0.0)
        calls.setdefault(part, 0)
        setattr(obj, name, timed(getattr(obj, name), part))


def main() -> int:
    out, args = Path(sys.argv[1]), sys.argv[2:]
    acc, calls = {}, {}
    install(acc, calls)
    from probes.entropy import main as probe

    try:
        return probe(args)
    finally:
        out.write_text(json.dumps({"cpu_s": acc, "calls": calls}))


if __name__ == "__main__":
    sys.exit(main())
