"""Regenerate the table in docs/performance.md: the questions a user asks about the client's cost, in one run.

    python scripts/bench.py [--quick] [--against REV] [--write]

1. The entropy probe (teacher-forced, the probe with the most client work a step) at two scales, at 128, 256 and 384
   in flight over one, two and three endpoints (three: the launcher's largest default): client CPU per step against
   its paired floor (the same steps' floor, sampled just before and just after its own runs: both requests sent,
   both replies read and decoded) and as a share of a GPU step's server time, what a step is made of (the floor,
   each asynchronous client, the probe's own work), and peak memory at each scale (scripts/bench_probe.py). ``--against REV``: the same command from commit REV, in turn
   on the same run.
2. The runner's call rate against the ideal at 64 and 256 samples in flight (scripts/bench_runner.py).

``--write`` replaces the part of docs/performance.md between its ``<!-- bench -->`` markers with the table, the
machine and the date; without it the table is printed.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import bench_probe  # noqa: E402
import bench_runner  # noqa: E402

DOC = REPO / "docs" / "performance.md"
BEGIN, END = "<!-- bench -->", "<!-- /bench -->"


def probe_rows(scales: list[int], against: list[str]) -> list[str]:
    m = bench_probe.measure(scales, 1000, against)
    fl, summary = m["floor"], bench_probe.summarise(m)
    out = [f"The floor: {fl['ms_per_step']:.1f} ms a step (two {fl['request_mb']:.2f} MB requests sent, two "
           f"{fl['reply_mb']:.2f} MB replies read and decoded into arrays, cold, through `http.client` one request at "
           f"a time; the median of {len(fl['samples_ms'])} samples across the bench, "
           f"{fl['samples_ms'][0]:.1f}-{fl['samples_ms'][-1]:.1f} ms).", "",
           f"| entropy probe, teacher-forced, client CPU per step (marginal {scales[0] * 10} -> {scales[-1] * 10} "
           "steps) | x its paired floor | share of a GPU step | peak RSS of the probe process |", "|---|---:|---|---|"]
    for s in summary:
        gpu = ", ".join(f"{share:.1%} of a {s['gpu_step_s'][k]:.2f} s {k} step" for k, share in s["gpu_share"].items())
        rss = "; ".join(f"{mb:.0f} MB at {n} steps, {f} in flight" for f, n, mb in s["rss"])
        e = s["endpoints"]
        out.append(f"| {s['code']}, {s['in_flight']} in flight ({e} endpoint{'s' if e > 1 else ''}): "
                   f"{s['ms_per_step']:.1f} ms a step | {s['floor_ratio']:.2f} (of {s['paired_floor_ms']:.1f} ms) | "
                   f"{gpu} | {rss} |")
    today = next(s for s in summary if s["code"] == "today" and s["endpoints"] == 1)
    for s in summary:
        if s["code"] != "today":
            out.append(f"| today / {s['code']}, paired, {s['in_flight']} in flight | "
                       f"{today['ms_per_step'] / s['ms_per_step']:.3f} | | |")
    p = m["parts"]
    names = {"httpx": "httpx's `AsyncClient` alone", "aiohttp": "aiohttp's `ClientSession` alone",
             "toolkit": "the toolkit's exchange (`request_json` over `ModelClient`: retries, deadline, liveness "
                        "watch, the body written in pieces)"}
    out += ["", "| what a step's CPU is made of, back to back on the same steps, one request at a time | ms a step "
            "| x the floor |", "|---|---:|---:|",
            f"| the floor (`http.client`) | {p['floor']:.1f} | 1.00 |"]
    out += [f"| the same exchange through {names[k]} | {p[k]:.1f} | {p[k] / p['floor']:.2f} |"
            for k in bench_probe.EXCHANGES]
    out += [f"| the probe's own work beyond the exchange (requests built, entropies, bounds, KL, alternatives, token "
            f"store, row) | {p['own_work']:.1f} | {p['own_work'] / p['floor']:.2f} |",
            f"| the toolkit's exchange and the probe's own work together | {p['toolkit'] + p['own_work']:.1f} | "
            f"{(p['toolkit'] + p['own_work']) / p['floor']:.2f} |"]
    return out


def runner_rows(samples: int) -> list[str]:
    out = ["", "| agent.run against a 3 s stand-in, 5 calls a sample, 165-token replies, a distinct ~320 KB photo per "
           "sample | ideal / measured | runner CPU a call |", "|---|---|---|"]
    for c in (64, 256):
        r = bench_runner.call_rate(samples=max(samples, 2 * c), concurrency=c, processes="auto", calls=5, latency=3.0,
                                   reply_tokens=165, seed=0, image_kb=320)
        ms = r["cpu_ms_per_call"]
        out.append(f"| {c} in flight, {r['samples']} samples, {r['processes_used']} process(es) | {r['ratio']:.3f} "
                   f"(serving span {r['span_ratio']:.3f}) | {ms:.1f} ms: {ms / 600:.3f} % of a 60 s paper-length "
                   f"call, {ms / 100:.2f} % of a 10 s one |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller scales (10 and 40 trajectories; 256 samples)")
    ap.add_argument("--against", default="", help="comma-separated git revisions for the paired probe comparison")
    ap.add_argument("--write", action="store_true", help="write the table into docs/performance.md")
    a = ap.parse_args(argv)
    scales = [10, 40] if a.quick else [40, 400]  # 400 trajectories fill the launcher's largest default (384 in flight)
    rows = probe_rows(scales, [r for r in a.against.split(",") if r]) + runner_rows(256 if a.quick else 512)
    head = (f"Measured {datetime.date.today().isoformat()} with `python scripts/bench.py"
            f"{' --quick' if a.quick else ''}{' --against ' + a.against if a.against else ''} --write` on "
            f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; the stand-in server "
            "shares these cores.")
    table = "\n".join([head, "", *rows])
    if not a.write:
        print(table)
        return 0
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        print(f"error: {DOC} has no {BEGIN} ... {END} section to replace", file=sys.stderr)
        return 2
    pre, rest = text.split(BEGIN, 1)
    DOC.write_text(pre + BEGIN + "\n" + table + "\n" + END + rest.split(END, 1)[1])
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
