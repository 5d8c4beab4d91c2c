"""The model backends' HTTP client: client CPU per request, httpx against aiohttp, through the toolkit's own path.

    python scripts/bench_http_client.py [--requests 640] [--concurrency 64] [--rounds 4]

Both clients go through ``agent.http.request_json`` (the path every backend request takes: retries, deadline,
redirect handling) against one loopback server in its own process that answers every POST with the same ~0.13 MB
JSON body (a teacher-forced scoring reply's size with SGLang's flat arrays), keeping connections alive as SGLang's
server does. The requests are shaped like a teacher-forced step's: an 8,000-id prompt (int32 array) and, every
second request, a ~0.43 MB base64 photo (a ~320 KB JPEG). Each client runs in its own process (so neither pays for
the other's imports) after a warm-up round of ``--concurrency`` requests; its CPU time (``time.process_time``, the
whole process: the event loop included) is divided by the requests. The rounds alternate the clients, so drift on
a shared machine hits both (ours; agent/http.py ``make_model_client``).
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SERVER = r'''
import asyncio, sys
BODY = b'{"meta_info":{"x":"' + b"a" * 130000 + b'"}}'
RESP = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
async def handle(r, w):
    try:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            n = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    n = int(line.split(b":")[1])
            await r.readexactly(n)
            w.write(RESP)
            await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        w.close()
async def main():
    s = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    async with s:
        await s.serve_forever()
asyncio.run(main())
'''

CLIENT = r'''
import asyncio, base64, json, os, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from agent.http import RetryPolicy, make_client, make_model_client, request_json
kind, port, n, c = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
photo = "data:image/jpeg;base64," + base64.b64encode(os.urandom(320_000)).decode()
ids = np.arange(8000, dtype=np.int32)
bodies = [{"input_ids": ids, "image_data": [photo] if i % 2 else None, "return_logprob": True} for i in range(n)]
url = f"http://127.0.0.1:{port}/generate"
async def main():
    client = make_client() if kind == "httpx" else make_model_client()
    sem = asyncio.Semaphore(c)
    async def one(b):
        async with sem:
            r = await request_json(client, "POST", url, json_body=b, policy=RetryPolicy(retries=0, timeout_s=120))
            assert len(r["meta_info"]["x"]) == 130000
    await asyncio.gather(*(one(b) for b in bodies[:c]))  # warm-up: connections open, code paths hot
    t = time.process_time()
    await asyncio.gather(*(one(b) for b in bodies))
    cpu = time.process_time() - t
    await client.aclose()
    print(json.dumps({"kind": kind, "cpu_s": cpu, "n": n}))
asyncio.run(main())
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=640)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4, help="rounds, each running both clients in turn")
    a = ap.parse_args(argv)
    port = _free_port()
    srv = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        if srv.stdout.readline().strip() != "ready":
            raise SystemExit("the loopback server did not start")
        got: dict[str, list[float]] = {"httpx": [], "aiohttp": []}
        for r in range(a.rounds):
            for kind in (("httpx", "aiohttp") if r % 2 == 0 else ("aiohttp", "httpx")):
                p = subprocess.run([sys.executable, "-c", CLIENT, str(REPO), kind, str(port), str(a.requests),
                                    str(a.concurrency)], capture_output=True, text=True)
                if p.returncode:
                    raise SystemExit(f"the {kind} client failed: {p.stderr[-2000:]}")
                res = json.loads(p.stdout.strip().splitlines()[-1])
                got[kind].append(1000 * res["cpu_s"] / res["n"])
    finally:
        srv.terminate()
        srv.wait(timeout=30)
    print(f"agent.http.request_json, {a.requests} POSTs of an 8,000-id prompt (every second one with a ~0.43 MB photo), "
          f"~0.13 MB replies, {a.concurrency} in flight, keep-alive; client CPU per request (ms), {a.rounds} rounds "
          f"({time.strftime('%Y-%m-%d')}):")
    for kind, label in (("httpx", "httpx (ClientPool, make_client)"), ("aiohttp", "aiohttp (AioPool, make_model_client)")):
        print(f"  {label:<40} " + "  ".join(f"{x:.3f}" for x in got[kind]))
    ratios = [h / o for h, o in zip(got["httpx"], got["aiohttp"])]
    print("  httpx / aiohttp, per round: " + "  ".join(f"{x:.2f}x" for x in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
