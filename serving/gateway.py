"""One smg gateway (SGLang Model Gateway) per model over the servers of many nodes (ours; issue 26).

    # on every GPU node: servers only, under the name other nodes reach it by
    bash serving/launch_qwen35.sh --advertise-host "$(hostname -f)" --serve-dir /shared/serve/$(hostname -s) 9b 27b
    # on the gateway node (any node, or a CPU box): one router per model over all of them
    python -m serving.gateway /shared/serve/* [--serve-dir .gateway] [--port 30100] [--prometheus-port 29100]
    # stop the routers (the nodes' servers are stopped on each node with serving/stop.sh)
    bash serving/stop.sh --serve-dir .gateway

Reads each node's ``endpoints.json`` (a launcher ``--serve-dir``, or the file), takes its running servers, and,
before starting anything:

- checks every server: ``/health`` answers and ``/v1/models`` serves the model its node recorded (an
  unreachable or changed server is refused, ``--skip-unhealthy`` leaves it out and says so);
- groups them by served model (a gateway never mixes models: without ``--enable-igw`` smg ignores
  the model name) and refuses a group whose servers differ in what a number means (logprob mode,
  deterministic inference, the weights' name), or a URL two nodes both claim (``127.0.0.1`` from two nodes:
  start them with ``--advertise-host``);
- checks that the planned ports are free.

Then it starts ``python -m smg.launch_router --worker-urls … --policy cache_aware --routing-key-override --host H
--port P --prometheus-port Q`` per model (smg 1.13.0's real CLI; the gateway health-checks its workers itself and
keeps each routing key on one worker),
waits until each serves its model, and writes ``endpoints.json`` in ``--serve-dir``: one ``router`` entry per
model (``router_of`` its workers) and the workers' own entries (``"remote": true``, with their node and
GPUs), so a run or probe through a gateway knows the GPUs behind a request (serving/endpoints.py). Clients
point ``--endpoint`` at the router (``agent.run``, the probes, ``scripts/slurm_array.sh``'s ``GATEWAY``).
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import time
import urllib.request
from pathlib import Path

from agent.cli import make_parser, port_number, positive_float

from .endpoints import remember, write_endpoints
from .plan import SGLANG_SITE, LaunchError, command_line, router_command
from .processes import kill_group, pid_record, port_free, start

log = logging.getLogger(__name__)

__all__ = ["read_nodes", "check_workers", "plan_gateways", "main"]

#: What must agree between the servers behind one router, or the numbers it returns would mix meanings.
SAME_IN_GROUP = ("logprob_mode", "deterministic")


def read_nodes(paths: list[str]) -> list[dict]:
    """Every running server recorded in the given launcher run directories / endpoints.json files, each with
    ``node`` (the file it came from)."""
    out = []
    for p in paths:
        f = Path(p)
        f = f / "endpoints.json" if f.is_dir() else f
        try:
            entries = json.loads(f.read_text())
        except FileNotFoundError:
            raise LaunchError(f"{f}: no such file (give a launcher --serve-dir or its endpoints.json)") from None
        except (OSError, ValueError) as e:
            raise LaunchError(f"{f}: unreadable endpoints file ({e})") from None
        if not isinstance(entries, list):
            raise LaunchError(f"{f}: not a launcher endpoints.json (a list of entries expected)")
        for e in entries:
            if isinstance(e, dict) and e.get("kind", "server") == "server" and e.get("status", "running") == "running" \
                    and e.get("url") and not e.get("remote"):
                out.append({**e, "node": str(f)})
    if not out:
        raise LaunchError(f"no running server in {', '.join(paths)}")
    return out


def _get_json(url: str, timeout: float):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = r.read()
    return json.loads(body) if body.strip() else None


def check_workers(workers: list[dict], timeout: float = 10.0) -> list[str]:
    """Why each unusable server is unusable (empty: all are fine): /health, then /v1/models against the record."""
    bad = []
    for w in workers:
        url = w["url"].rstrip("/")
        try:
            urllib.request.urlopen(url + "/health", timeout=timeout).read()
            models = _get_json(url + "/v1/models", timeout)
            served = models["data"][0]["id"]
        except Exception as e:  # noqa: BLE001 - said, with the node it came from
            bad.append(f"{url} ({w['node']}): not answering ({type(e).__name__}: {e})")
            w["_bad"] = True
            continue
        want = w.get("served_model") or w.get("model")
        if want and served != want:
            bad.append(f"{url} ({w['node']}): serves {served!r}, its node recorded {want!r}")
            w["_bad"] = True
    return bad


def plan_gateways(workers: list[dict], port: int, prometheus_port: int) -> list[dict]:
    """One router per served model: ``{model, port, prometheus_port, workers}``; refused on a URL two nodes claim
    or a group whose servers disagree on what their numbers mean."""
    seen: dict = {}
    for w in workers:
        u = w["url"].rstrip("/")
        if u in seen and seen[u] != w["node"]:
            raise LaunchError(f"{u} is recorded by two nodes ({seen[u]} and {w['node']}): a loopback URL names each "
                              "node's own host; start each node's servers with --advertise-host HOST")
        seen[u] = w["node"]
    groups: dict[str, list[dict]] = {}
    for w in workers:
        groups.setdefault(w.get("served_model") or w.get("model"), []).append(w)
    plans = []
    for j, (model, ws) in enumerate(sorted(groups.items())):
        for k in SAME_IN_GROUP:
            vals = {str(w.get(k)) for w in ws}
            if len(vals) > 1:
                raise LaunchError(f"the servers of {model} differ in {k} ({', '.join(sorted(vals))}): one router over "
                                  "them would mix numbers that mean different things; relaunch them alike")
        names = {Path(str(w.get("weights") or "")).name for w in ws}
        if len(names) > 1:
            raise LaunchError(f"the servers of {model} load different weights ({', '.join(sorted(names))})")
        plans.append({"model": model, "port": port + j, "prometheus_port": prometheus_port + j,
                      "workers": [w["url"].rstrip("/") for w in ws], "entries": ws})
    return plans


def _wait_router(url: str, model: str, proc, log: str, timeout: float) -> None:
    t0 = time.time()
    last = ""
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            tail = open(log, errors="replace").read()[-2000:] if os.path.exists(log) else ""
            raise LaunchError(f"the router for {model} exited ({proc.returncode}); last log lines ({log}):\n{tail}")
        try:
            got = _get_json(url + "/v1/models", 5)
            ids = [m.get("id") for m in (got or {}).get("data") or []]
            if model in ids:
                return
            last = f"/v1/models lists {ids}"
        except Exception as e:  # noqa: BLE001 - not up yet
            last = str(e)
        time.sleep(0.5)
    raise LaunchError(f"the router for {model} did not serve it within {timeout:g}s ({last}); see {log}")


def _parser():
    ap = make_parser("python -m serving.gateway", __doc__, [
        "python -m serving.gateway /shared/serve/node1 /shared/serve/node2 --port 30100",
        "python -m serving.gateway /shared/serve/* --dry-run"])
    ap.add_argument("nodes", nargs="+", help="each node's launcher --serve-dir (or its endpoints.json)")
    ap.add_argument("--serve-dir", dest="run_dir", default=".gateway", help="logs, PID files, commands, endpoints.json (default: .gateway)")
    ap.add_argument("--port", type=port_number, default=30100, help="first router's port; router j gets +j (default: 30100)")
    ap.add_argument("--prometheus-port", type=port_number, default=29100,
                    help="first router's metrics port; router j gets +j (default: 29100: not the launcher's 29000)")
    ap.add_argument("--host", default="0.0.0.0", help="listen address (default: 0.0.0.0)")
    ap.add_argument("--advertise-host", metavar="HOST", help="the name clients reach this node by (endpoints.json)")
    ap.add_argument("--timeout", type=positive_float, default=300, help="seconds to wait for each router (default: 300)")
    ap.add_argument("--skip-unhealthy", action="store_true", help="leave out servers that fail the check (said)")
    ap.add_argument("--dry-run", action="store_true", help="check and print the routers' commands; start nothing")
    ap.add_argument("--router-command", metavar="CMD", help="replaces 'python -m smg.launch_router'")
    return ap


def _plans(a) -> list[dict]:
    """The healthy servers of the given nodes, one router plan per model, its ports free (LaunchError otherwise)."""
    workers = read_nodes(a.nodes)
    bad = check_workers(workers)
    if bad and not a.skip_unhealthy:
        raise LaunchError(f"{len(bad)} of {len(workers)} servers cannot be put behind a gateway:\n  "
                          + "\n  ".join(bad) + "\n(--skip-unhealthy leaves them out)")
    for b in bad:
        log.info(f"gateway: left out: {b}")
    workers = [w for w in workers if not w.get("_bad")]
    if not workers:
        raise LaunchError("no healthy server left")
    plans = plan_gateways(workers, a.port, a.prometheus_port)
    for p in plans:
        for what, port in (("port", p["port"]), ("metrics port", p["prometheus_port"])):
            if not port_free(port):
                raise LaunchError(f"the router for {p['model']}: {what} {port} is in use (choose --port / "
                                  "--prometheus-port)")
    return plans


def _start_routers(a, plans: list[dict], run_dir: Path, host: str, entries: list) -> bool:
    """Start each planned router and wait until it serves its model; on a failure stop what was started."""
    started = []
    try:
        for p in plans:
            name = f"router-{p['port']}"
            (run_dir / f"{name}.cmd").write_text(command_line(p["cmd"]) + "\n")
            log = str(run_dir / f"{name}.log")
            env = {"PYTHONPATH": f"{SGLANG_SITE}{os.pathsep}{os.environ['PYTHONPATH']}" if os.environ.get("PYTHONPATH")
                   else str(SGLANG_SITE)} if SGLANG_SITE.is_dir() else {}
            proc = start(p["cmd"], env, log)
            started.append(proc)
            (run_dir / f"{name}.pid").write_text(pid_record(proc.pid))
            _wait_router(f"http://127.0.0.1:{p['port']}", p["model"], proc, log, a.timeout)
            lm = p["entries"][0]
            entries.append({"url": f"http://{host}:{p['port']}", "model": p["model"], "served_model": p["model"],
                            "router_of": p["workers"], "prometheus_port": p["prometheus_port"],
                            "logprob_mode": lm.get("logprob_mode"), "deterministic": lm.get("deterministic"),
                            "weights": lm.get("weights"), "size": lm.get("size"), "gpus": "", "pid": proc.pid,
                            "log": log, "status": "running", "kind": "router",
                            "nodes": sorted({w["node"] for w in p["entries"]})})
            write_endpoints(run_dir, entries)
            print(f"ready: http://{host}:{p['port']} serves {p['model']}", flush=True)
    except LaunchError as e:
        for proc in started:
            kill_group(proc.pid)
        log.info(f"gateway: {e}\ngateway: stopped the routers this command started")
        return False
    return True


def main(argv=None) -> int:
    ap = _parser()
    a = ap.parse_args(argv)
    a.python = os.environ.get("PYTHON") or sys.executable
    try:
        plans = _plans(a)
    except LaunchError as e:
        log.info(f"gateway: {e}")
        return 2
    host = a.advertise_host or ("127.0.0.1" if a.host in ("0.0.0.0", "::") else a.host)
    for p in plans:
        p["cmd"] = router_command(p["workers"], p["port"], a, p["prometheus_port"])
        gpus = sorted({str(w.get("gpus")) for w in p["entries"]})
        print(f"{p['model']}: router http://{host}:{p['port']} over {len(p['workers'])} server(s) on "
              f"{len({w['node'] for w in p['entries']})} node(s) (GPUs per server: {', '.join(gpus)})")
        print("  " + command_line(p["cmd"]))
    if a.dry_run:
        return 0
    run_dir = Path(a.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    remember(run_dir)
    entries = [{**{k: v for k, v in w.items() if not k.startswith("_") and k != "pid"}, "remote": True}
               for p in plans for w in p["entries"]]
    if not _start_routers(a, plans, run_dir, host, entries):
        return 1
    write_endpoints(run_dir, entries)
    print(f"\nendpoints written to {run_dir / 'endpoints.json'}; stop: bash serving/stop.sh --serve-dir "
          f"{shlex.quote(str(run_dir))}")
    for p in plans:
        w = p["entries"][0].get("weights") or "MODEL_DIR"
        print(f"clients for {p['model']}: --backend sglang --endpoint http://{host}:{p['port']} --model-dir "
              f"{shlex.quote(str(w))} --logprob-mode {p['entries'][0].get('logprob_mode') or 'scaled'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
