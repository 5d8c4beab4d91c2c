"""What the probe commands share once their arguments parse: the model server, the model check, the prompts the run
recorded, the hardware held, and exit codes for Ctrl-C and clear errors (their shared flags: probes/cli.py).

    backend = backend_for(args, run.header)        # the probe's model server (default: the run's own)
    ident = await probe_model_check(run, backend, force=args.force)   # refuses another model than the run's
    result, code = run_async(coro, "finished steps")
"""
from __future__ import annotations

import asyncio
import json
import logging

from agent.backends import make_backend
from agent.backends.base import BackendError
from agent.backends.pieces import lend_pieces
from agent.backends.spread import Spread
from agent.backends.tiny_model import is_tiny_model
from agent.errors import EXIT_DISK_FULL, ToolkitError, disk_full_message
from agent.identity import deterministic_cost, same_model, server_differences
from agent.preflight import PreflightError, check_output_room, model_identity
from agent.record import RunHeader
from serving.endpoints import gpus_behind, gpus_held

from .cli import PROBE_CONCURRENCY

log = logging.getLogger(__name__)

__all__ = ["run_async", "backend_for", "probe_model_check", "probe_concurrency", "serving_hardware", "record_session",
           "RecordedPrompts", "keeps_unparsed"]


class RecordedPrompts:
    """Lends each trajectory's recorded prompt ids (agent/backends/pieces.py) to the probe's backend while the probe
    works on that trajectory, so its requests send the ids the run sent and tokenise only what the run never sent.

        recorded = RecordedPrompts(backend, off=args.retokenize)
        give_back = recorded.lend(run, line)        # RunError: the record is unreadable (names the file)
        try: ... finally: give_back()

    Pieces made by another tokenizer than the backend's (another --model-dir) are not lent: the probe then
    tokenises, as for a run without them, and says so once."""

    def __init__(self, backend, *, off: bool = False):
        self.backend = backend
        self.off = bool(off)
        self.trajectories = 0   # trajectories whose recorded ids were lent
        self._said = False
        members = getattr(backend, "backends", None) or [backend]
        # the backends that send token ids and take lent ones (SGLang's native); the others (in-process, chat,
        # scripted) have no use for them, and the record is not even read
        self._takers = [b for b in members if getattr(b, "book", None) is not None]

    def lend(self, run, line: dict):
        if self.off or not self._takers:
            return _nothing
        fingerprint, pieces = run.prompt_pieces(line)
        lent, give_back = lend_pieces(self.backend, fingerprint, pieces)
        self.trajectories += lent
        if pieces and not lent and not self._said:
            self._said = True
            mine = self._takers[0].fingerprint or "none"
            log.info(f"{run.path}: the run's prompt ids were made by another tokenizer (sha256 {fingerprint[:12]}…) than "
                     f"this --model-dir's ({mine[:12]}…); the probe tokenises the prompts itself")
        return give_back

    def summary(self) -> dict:
        """What probe.json records: whether recorded ids were used, for how many trajectories, and how many
        prompt pieces were taken from the record or tokenised (the backend's counts)."""
        members = getattr(self.backend, "backends", None) or [self.backend]
        stats = [b.piece_stats for b in members if isinstance(getattr(b, "piece_stats", None), dict)]
        total = {k: sum(s.get(k, 0) for s in stats) for k in ("recorded", "tokenised", "tokenised_chars")}
        return {"retokenize": self.off, "trajectories_with_recorded_ids": self.trajectories,
                "pieces_from_the_record": total["recorded"], "pieces_tokenised": total["tokenised"],
                "characters_tokenised": total["tokenised_chars"]}


def _nothing() -> None:
    return None


def serving_hardware(backend, *, gpus_per_server: int | None = None, serving_dir=None) -> dict:
    """The hardware a probe holds: how many model servers, and how many GPUs behind each (``--gpus-per-server``,
    else the launcher's endpoints.json; None when unknown, never guessed)."""

    urls = [getattr(b, "url", None) or getattr(b, "base", None) for b in (getattr(backend, "backends", None) or [backend])]
    urls = [u for u in urls if u]
    if not urls:  # in-process or scripted: no server to account for
        return {"servers": 0, "gpus_per_server": None, "gpus_from": None, "gpus_held": None}
    if gpus_per_server:
        return {"servers": len(urls), "gpus_per_server": int(gpus_per_server), "gpus_from": "--gpus-per-server",
                "gpus_held": len(urls) * int(gpus_per_server)}
    counts = {gpus_behind(u, serving_dir) for u in urls}
    g = counts.pop() if len(counts) == 1 else None
    # held: a router's every worker (a gateway over 2 TP=4 workers holds 8 GPUs, though a request runs on 4)
    held = [gpus_held(u, serving_dir) for u in urls]
    return {"servers": len(urls), "gpus_per_server": g, "gpus_from": "endpoints.json" if g else None,
            "gpus_held": sum(held) if all(h is not None for h in held) else None}


def record_session(prev_json, hardware: dict, started: float, wall_s: float, units: int) -> dict:
    """Append this session to the probe's sessions (kept in its probe.json across resumes) and total them.

    GPU-seconds are the hardware *held*: each session's wall time x the GPUs behind its servers (a router's: all
    its workers'), summed (ours).
    The sum of request latencies is not: SGLang batches the requests in flight, so 128 concurrent 18-s requests
    cost one group its wall time, not the sum of its requests'; it is kept as ``request_seconds`` beside. Unknown GPUs: None (never 0)."""

    sessions = []
    try:
        if prev_json:  # None: a new probe
            sessions = list(json.loads(open(prev_json).read()).get("cost", {}).get("sessions") or [])
    except (OSError, ValueError, AttributeError):
        pass
    sessions.append({"started": round(started, 3), "wall_s": round(wall_s, 3), "units": int(units), **hardware})
    def gpus(x):  # sessions recorded before gpus_held: servers x GPUs per server
        if "gpus_held" in x:
            return x["gpus_held"]
        return x["servers"] * x["gpus_per_server"] if x.get("gpus_per_server") and x.get("servers") else None

    known = all(gpus(x) for x in sessions)
    held = sum(x["wall_s"] * gpus(x) for x in sessions) if known else None
    return {"sessions": sessions, "wall_s": round(sum(x["wall_s"] for x in sessions), 3),
            "gpu_seconds": None if held is None else round(held, 1),
            "gpu_hours": None if held is None else round(held / 3600, 3)}


def backend_for(args, run_header: RunHeader):
    """The probe's backend: the one given on the command line, else the one the run used. Several
    ``--endpoint`` s (or a run recorded over several, when none is given) make one
    :class:`~agent.backends.spread.Spread`: each trajectory keeps one server (its prefix cache)."""

    b = run_header.backend
    mode = args.logprob_mode or b.logprob_mode
    kind = args.backend or b.kind
    if kind == "local":
        return make_backend("local", model_dir=args.model_dir or (None if args.backend else b.model_dir),
                            logprob_mode=mode)
    if kind == "scripted":
        return make_backend("scripted")
    if kind in ("sglang", "vllm", "openai"):
        endpoints = list(args.endpoint or []) or ([e for e in b.endpoints if e] if not args.backend else [])
        endpoints = list(dict.fromkeys(endpoints))
        if endpoints:
            extra = {"flat_logprobs": False} if kind == "sglang" and getattr(args, "nested_logprobs", False) else {}
            made = [make_backend(kind, endpoint=e, model=args.model or (None if args.backend else b.model),
                                 model_dir=args.model_dir or (None if args.backend else b.model_dir),
                                 logprob_mode=mode, server=args.server, api_key_env=args.api_key_env, **extra)
                    for e in endpoints]
            if len(made) == 1:
                return made[0]

            return Spread(made)
    raise BackendError(f"no usable backend: the run header names {b.kind!r} with endpoints {b.endpoints}; "
                       "pass --backend / --endpoint / --model-dir")


def probe_concurrency(args, backend) -> int:
    """``--concurrency`` if given, else :data:`PROBE_CONCURRENCY` per model server (8 in-process)."""
    if getattr(args, "concurrency", None):
        return args.concurrency
    n = len(getattr(backend, "backends", None) or [backend])
    kind = getattr(backend, "name", "")
    return 8 if kind in ("local", "scripted") else PROBE_CONCURRENCY * n




async def probe_model_check(run, backend, *, force: bool = False) -> dict:
    """The probe backend's model identity; refuses (PreflightError) when it is not the model that recorded the run."""
    ident = await model_identity(backend)
    cost = deterministic_cost(ident.get("server"))
    if cost:  # the serving check's word on what the probe will cost
        log.warning(f"WARNING: {cost}")
    recorded = run.header.model.as_recorded() if run.header.model else None
    # a regenerated step asks for the run's output length: one the server cannot give any call is refused here
    check_output_room(ident, run.header.sampling.max_tokens, flag="the run's max_tokens")
    # the same model, computing the same way: other weights under the same name (a redeployed checkpoint) differ
    # in the server's model_path, as a resume would find (agent/rundir/writer.py)
    why = "the run header records no model identity (made by an older version?)" if not recorded else \
        same_model(recorded, ident) or server_differences(recorded, ident, unverified_ok=True)
    if why:
        if not force:
            raise PreflightError(f"{run.path}: {why}. A probe must query the model that made the run; "
                                 "pass --force to probe anyway (it is recorded in probe.json)")
        log.warning(f"warning: --force: {why}")
        ident = {**ident, "forced_mismatch": why}
    return ident


def keeps_unparsed(asked: bool, header: RunHeader) -> bool:
    """``--include-unparsed``, or a run of the embedded tiny model, in process or served (random weights: no first
    call of it parses, so the paper's rule, analysis/estimators/selection.py, would keep nothing to probe); said when taken,
    and recorded by the probe as ``include_unparsed``."""
    if asked:
        return True
    b, weights = header.backend, header.model.weights if header.model else None
    if b.embedded_tiny_model or is_tiny_model(b.model_dir) or is_tiny_model(weights):
        log.info("NOTE: the run is the embedded tiny model's (random weights: none of its first calls parses): its "
                 "trajectories are kept as --include-unparsed keeps them (recorded); its numbers are meaningless")
        return True
    return False


def run_async(coro, kept: str, out=None):
    """``(result, 0)``; ``(None, 130)`` on Ctrl-C (saying what is kept); ``(None, 2)`` on a clear error;
    ``(None, EXIT_DISK_FULL)`` when the disk where the command writes (``out``) is full, in one line."""
    try:
        return asyncio.run(coro), 0
    except KeyboardInterrupt:
        log.info(f"interrupted; rerun to resume ({kept} are kept)")
        return None, 130
    except (ToolkitError, ValueError, OSError) as e:
        full = disk_full_message(e, out or ".", kept[0].upper() + kept[1:])
        if full:
            log.error(full)
            return None, EXIT_DISK_FULL
        log.error(f"error: {e}")
        return None, 2
