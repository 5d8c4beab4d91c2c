"""What the probe commands share: backend options, the model check, and exit codes for Ctrl-C and clear errors.

    add_backend_args(parser)                       # --backend/--endpoint/--model/--model-dir/--logprob-mode
    backend = backend_for(args, run.header)        # the probe's model server (default: the run's own)
    ident = await probe_model_check(run, backend, force=args.force)   # refuses another model than the run's
    result, code = run_async(coro, "finished steps")
"""
from __future__ import annotations

import asyncio
import sys

from agent.backends.base import BackendError
from agent.preflight import PreflightError, model_identity, same_model
from agent.rundir import RunError
from agent.tools.live import MissingKeyError

__all__ = ["run_async", "add_backend_args", "backend_for", "probe_model_check", "PROBE_BACKENDS"]

PROBE_BACKENDS = ("local", "sglang", "openai")


def add_backend_args(ap) -> None:
    g = ap.add_argument_group("model backend (default: the one that recorded the run)")
    g.add_argument("--backend", choices=PROBE_BACKENDS, help="local | sglang | openai (default: the run's)")
    g.add_argument("--endpoint", help="model server URL (sglang, openai)")
    g.add_argument("--model", help="served model name (default: what the server serves)")
    g.add_argument("--model-dir", help="weights / tokenizer directory (local; sglang: for the chat template)")
    g.add_argument("--logprob-mode", choices=("raw", "scaled"),
                   help="what the server's output logprobs are (default: the run's)")


def backend_for(args, run_header: dict):
    """The probe's backend: the one given on the command line, else the one the run used."""
    from agent.backends import make_backend

    b = run_header.get("backend") or {}
    mode = args.logprob_mode or b.get("logprob_mode", "scaled")
    if args.backend:
        if args.backend == "local":
            return make_backend("local", model_dir=args.model_dir, logprob_mode=mode)
        return make_backend(args.backend, endpoint=args.endpoint, model=args.model, model_dir=args.model_dir,
                            logprob_mode=mode)
    if b.get("kind") == "local":
        return make_backend("local", model_dir=b.get("model_dir"), logprob_mode=mode)
    if b.get("kind") in ("sglang", "openai") and b.get("endpoints"):
        return make_backend(b["kind"], endpoint=b["endpoints"][0], model=b.get("model"), model_dir=b.get("model_dir"),
                            logprob_mode=mode)
    raise BackendError(f"no backend given and the run header names none usable ({b.get('kind')!r}): "
                       "pass --backend/--endpoint/--model-dir")


async def probe_model_check(run, backend, *, force: bool = False) -> dict:
    """The probe backend's model identity; refuses (PreflightError) when it is not the model that recorded the run."""
    ident = await model_identity(backend)
    recorded = run.header.get("model")
    why = "the run header records no model identity (made by an older version?)" if not recorded else \
        same_model(recorded, ident)
    if why:
        if not force:
            raise PreflightError(f"{run.path}: {why}. A probe must query the model that made the run; "
                                 "pass --force to probe anyway (it is recorded in probe.json)")
        print(f"warning: --force: {why}", file=sys.stderr)
        ident = {**ident, "forced_mismatch": why}
    return ident


def run_async(coro, kept: str):
    """``(result, 0)``; ``(None, 130)`` on Ctrl-C (saying what is kept); ``(None, 2)`` on a clear error."""
    try:
        return asyncio.run(coro), 0
    except KeyboardInterrupt:
        print(f"interrupted; rerun to resume ({kept} are kept)", file=sys.stderr)
        return None, 130
    except (RunError, BackendError, PreflightError, MissingKeyError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return None, 2
