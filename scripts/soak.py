"""Soak test: a runner killed with SIGKILL again and again under injected faults loses nothing, duplicates nothing.

    python scripts/soak.py                                  # 20 kills, 6 samples x 60 trials = 360 units, --processes 2
    python scripts/soak.py --kills 5 --trials 4 --processes 1 --fault-rate 0.2 --method mmcontextfold

A loopback SGLang stand-in (serving/fakes/sglang_server.py) answers with a fixed latency and injects faults
into ``--fault-rate`` of the requests (429, 5xx, dropped connections, truncated bodies, slow replies, and
garbage model outputs: no tags, an unclosed <think>, invalid JSON, an unknown tool, 200 KB outputs, empty or
null content, lone surrogates, control characters, a <subtask> with missing fields). ``python -m
agent.run`` runs the demo benchmark against it and is killed with SIGKILL (its whole process group, worker
processes included) ``--kills`` times, each after a random few more lines were written; then it is run once more to the end. The run
directory must then pass ``python -m agent.rundir check``. Prints units expected / present / duplicated /
lost, the statuses, and the faults injected / survived (a fault survived when its unit still finished
``ok`` or ``no_answer``). Exit 0 only when nothing was lost or duplicated and the check is clean.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

__all__ = ["soak", "main"]


def soak(out: Path, *, kills: int = 20, trials: int = 40, processes: int = 2, concurrency: int = 8,
         fault_rate: float = 0.1, latency: float = 0.05, method: str = "react", seed: int = 0,
         min_lines: int = 1, max_lines: int = 6, jitter_s: float = 0.05, stall_s: float = 300.0,
         final_timeout: float = 900.0, progress=print) -> dict:
    """Kill the runner's process group ``kills`` times, each after it wrote ``min_lines``..``max_lines`` more
    lines (plus a random 0..``jitter_s`` s, so some kills land mid-write; ``stall_s`` bounds a run that makes
    no progress), then let it finish and check the run directory."""
    from agent.rundir import check_run
    from serving.fakes.policy import agent_policy
    from serving.fakes.sglang_server import FakeServer

    rng = random.Random(seed)
    srv = FakeServer(latency_s=latency, fault_rate=fault_rate, seed=seed, slow_s=6.0, reply=agent_policy)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    cmd = [sys.executable, "-m", "agent.run", "--method", method, "--backend", "openai", "--endpoint", srv.url,
           "--benchmark", "demo", "--trials", str(trials), "--concurrency", str(concurrency), "--processes",
           str(processes), "--t-max", "4", "--out", str(out), "--no-progress", "--request-timeout", "3",
           "--max-consecutive-errors", "0"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done_kills, t0 = 0, time.time()
    results = out / "results.jsonl"

    def n_lines() -> int:
        try:
            return results.read_bytes().count(b"\n")
        except FileNotFoundError:
            return 0

    try:
        while done_kills < kills:
            p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
            # kill after the run has made progress (a few more lines written), never after a fixed time: on a
            # loaded machine a timed kill can land before any work, and on a fast one after the run has ended
            start, want = n_lines(), rng.randint(min_lines, max_lines)
            deadline = time.time() + stall_s
            while p.poll() is None and n_lines() < start + want and time.time() < deadline:
                time.sleep(0.02)
            if p.poll() is None:
                time.sleep(rng.uniform(0, jitter_s))  # now and then inside the next line's write
            if p.poll() is not None:
                progress(f"  run ended by itself before kill {done_kills + 1} (exit {p.returncode}); restarting")
                if p.returncode in (0, 3):  # finished: nothing left to kill
                    break
                continue
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            done_kills += 1
            progress(f"  kill {done_kills}/{kills} after {n_lines() - start} new line(s)")
        final = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=final_timeout)
        rep = check_run(out)
    finally:
        srv.shutdown()
        srv.server_close()
    from agent.rundir import RunDir

    lines = RunDir(out).index(warn=False)  # every intact line's summary, in file order
    keys = [(ln["sample_id"], ln["trial"]) for ln in lines]
    statuses: dict = {}
    latest = {}
    for ln in lines:
        latest[(ln["sample_id"], ln["trial"])] = ln
    for ln in latest.values():
        statuses[ln["status"]] = statuses.get(ln["status"], 0) + 1
    injected = dict(srv.injected)
    failed_units = statuses.get("error", 0) + statuses.get("timeout", 0)
    return {"kills": done_kills, "expected": rep.expected, "present": rep.present, "duplicated": len(rep.duplicates),
            "lost": len(rep.missing), "lines": len(keys), "statuses": statuses, "torn_lines": len(rep.torn),
            "intact": rep.intact, "complete": rep.complete, "faults_injected": sum(injected.values()),
            "faults_by_kind": injected, "units_failed": failed_units,
            "final_exit": final.returncode, "elapsed_s": round(time.time() - t0, 1), "check": rep.lines()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/soak.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                 epilog="example: python scripts/soak.py --kills 5 --trials 4 --processes 1")
    ap.add_argument("--kills", type=int, default=20, help="SIGKILLs of the runner's process group")
    ap.add_argument("--trials", type=int, default=60, help="trials of the 6 demo samples (units = 6 x trials)")
    ap.add_argument("--processes", type=int, default=2, help="the runner's --processes")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--fault-rate", type=float, default=0.1, help="share of requests that get a fault")
    ap.add_argument("--latency", type=float, default=0.05, help="seconds per model reply")
    ap.add_argument("--method", default="react", choices=("react", "mmcontextfold"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="run directory (default: a fresh temporary one)")
    a = ap.parse_args(argv)
    import tempfile

    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="mmcf-soak-")) / "run"
    print(f"soak: {a.kills} kills, 6 x {a.trials} units, --processes {a.processes}, fault rate {a.fault_rate} -> {out}")
    r = soak(out, kills=a.kills, trials=a.trials, processes=a.processes, concurrency=a.concurrency,
             fault_rate=a.fault_rate, latency=a.latency, method=a.method, seed=a.seed)
    print(f"units expected {r['expected']}  present {r['present']}  duplicated {r['duplicated']}  lost {r['lost']}  "
          f"(lines {r['lines']}, torn {r['torn_lines']}, statuses {r['statuses']})")
    print(f"faults injected {r['faults_injected']}  survived {r['faults_injected'] - r['units_failed']}  "
          f"(units that still ended in error/timeout: {r['units_failed']}) by kind {r['faults_by_kind']}")
    print(f"kills {r['kills']}; final run exit {r['final_exit']}; {r['elapsed_s']} s")
    print("\n".join(r["check"]))
    ok = r["lost"] == 0 and r["duplicated"] == 0 and r["intact"] and r["complete"]
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
