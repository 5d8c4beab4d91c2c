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

#: (part, object path, attribute, is a coroutine function)
WRAPPED = (
    ("render", "agent.backends.sglang_native:SGLangBackend", "render", False),
    ("tokenise", "agent.backends.sglang_native:SGLangBackend", "prompt_ids", False),
    ("body", "agent.http", "dumps", False),
    ("decode", "agent.backends.sglang_native", "decode_generate_reply", False),
    ("arrays", "agent.backends.sglang_native:SGLangBackend", "parse_score", False),
    ("influence", "probes.entropy", "token_influence", False),
    ("alternatives", "probes.entropy", "_alternatives", False),
    ("line_read", "agent.rundir.reader:Run", "full", False),
    ("sidecar_read", "agent.rundir.reader:Run", "tokens", False),
    ("token_store", "probes.entropy:TokenStore", "append", False),
    ("token_store", "probes.entropy:TokenStore", "commit", False),
    ("messages", "agent.rundir.reader:Run", "sendable_messages", False),
    ("messages", "probes.entropy", "strip_query_images", False),
    ("records", "agent.backends.sglang_native", "record_messages", False),
    ("records", "agent.backends.sglang_native", "mark_think", False),
    ("histograms", "probes.entropy", "entropy_histogram", False),
    ("collector", "probes.entropy", "collect_cycles", False),
)


def install(acc: dict, calls: dict) -> None:
    import importlib

    def timed(f, part, is_async):
        if is_async:
            async def g(*a, **k):
                t = time.process_time()
                try:
                    return await f(*a, **k)
                finally:
                    acc[part] += time.process_time() - t
                    calls[part] += 1
        else:
            def g(*a, **k):
                t = time.process_time()
                try:
                    return f(*a, **k)
                finally:
                    acc[part] += time.process_time() - t
                    calls[part] += 1
        return g

    import agent.rundir.common as common

    if common._TRIM is not None:  # glibc's malloc_trim, inside the collector's part: timed on its own too
        acc["trim"], calls["trim"] = 0.0, 0
        common._TRIM = timed(common._TRIM, "trim", False)
    for part, where, name, is_async in WRAPPED:
        mod, _, cls = where.partition(":")
        obj = importlib.import_module(mod)
        if cls:
            obj = getattr(obj, cls)
        acc.setdefault(part, 0.0)
        calls.setdefault(part, 0)
        setattr(obj, name, timed(getattr(obj, name), part, is_async))


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
