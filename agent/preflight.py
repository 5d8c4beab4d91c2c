"""Checks that run before any work: a number is right or refused (exit 2, one clear message).

    from agent.preflight import model_identity, same_model, require_keys, check_benchmark_images
    ident = await model_identity(backend)          # which model a backend really serves (asks the server)
    same_model(run.header["model"], ident)          # -> None, or why the two differ

What is checked, and by whom (docs/reliability.md):

- the model server answers and serves the model named (``/v1/models``; SGLang also ``/model_info``, else ``/get_model_info``,
  whose weights path must match ``--model-dir``); several ``--endpoint``s must serve one model;
- the benchmark's images exist, are readable and are images (``--allow-missing-images`` runs the rest);
- every API key a stage needs is set (search/visit/lens for live tools, the judge's, the annotator's),
  and live lens_search has a public-URL configuration;
- a probe queries the model that recorded the run (``--force`` overrides and is recorded).

:func:`model_identity` records ``{"backend", "served_model", "weights", "fingerprint"}``: the served
model id, the weights path the server loaded (or the local directory) and, for an in-process model, a
fingerprint of its config and weight files, so that a moved directory still matches and another model
never does.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from pathlib import Path

from .backends import BackendError, make_backend
from .backends.images import ImageError, load_image
from .backends.spread import Spread
from .benchmarks import resolve_benchmark
from .cli import add_backend_args, done, make_parser
from .http import HTTPError, RetryPolicy, request_json
from .redact import public_url
from .tools.live import MissingKeyError, require_live_tools

__all__ = ["PreflightError", "model_identity", "local_identity", "same_model", "require_keys",
           "check_benchmark_images", "PREFLIGHT_POLICY", "server_facts", "server_differences", "unverified_facts", "deterministic_cost",
           "SERVER_FACTS", "NUMBER_FACTS"]

#: A preflight request fails fast: one retry, 15 s.
PREFLIGHT_POLICY = RetryPolicy(retries=1, backoff_s=0.5, timeout_s=15.0)


class PreflightError(RuntimeError):
    """A check before the work failed: nothing was done."""


def local_identity(model_dir, kind: str = "local") -> dict:
    """Identity of an in-process model directory: its name, path and a fingerprint of config + weights."""
    p = Path(model_dir)
    h = hashlib.sha256()
    for name in ("config.json", "mmcf_build.json"):
        f = p / name
        if f.exists():
            h.update(name.encode() + f.read_bytes())
    for f in sorted(p.glob("*.safetensors")) + sorted(p.glob("*.bin")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return {"backend": kind, "served_model": p.name, "weights": str(p.resolve()), "fingerprint": h.hexdigest()[:16]}


async def _spread_identity(spread: Spread) -> dict:
    """The one model every server of a :class:`Spread` serves; refuses servers that disagree."""
    idents = [await model_identity(b) for b in spread.backends]
    for b, ident in zip(spread.backends[1:], idents[1:]):
        why = same_model(idents[0], ident)
        if why:
            raise PreflightError(f"the servers given serve different models ({getattr(b, 'base', b)}: {why}); "
                                 "one probe, one model")
    return {**idents[0], "endpoints": [getattr(b, "base", None) for b in spread.backends]}


async def model_identity(backend) -> dict:
    """Ask a backend which model it serves; raises :class:`PreflightError` when the server cannot say.

    Local and scripted backends answer from their own state; HTTP backends ask the server once (fast:
    :data:`PREFLIGHT_POLICY`), so an unreachable endpoint fails here, before any work.
    """
    kind = getattr(backend, "name", type(backend).__name__)
    if kind == "local":
        return local_identity(backend.model_dir)
    if kind == "scripted":
        return {"backend": "scripted", "served_model": backend.model, "weights": None, "fingerprint": None}
    if kind == "openai":
        return await _openai_identity(backend)
    if kind == "sglang":
        return await _sglang_identity(backend)
    if isinstance(backend, Spread):
        return await _spread_identity(backend)
    raise PreflightError(f"backend {kind!r} cannot say which model it serves")


async def _get(backend, url: str, what: str):
    try:
        return await request_json(backend._client, "GET", url, headers=getattr(backend, "_headers", None),
                                  policy=PREFLIGHT_POLICY, what=what)
    except HTTPError as e:
        raise PreflightError(f"the model server is unreachable or refused: {e}") from None


def _ids(data, url: str) -> list[str]:
    try:
        ids = [m["id"] for m in data["data"]]
    except (KeyError, TypeError):
        raise PreflightError(f"{public_url(url)}: not an OpenAI-style model list: {str(data)[:200]}") from None
    if not ids:
        raise PreflightError(f"{public_url(url)}: the server lists no model")
    return ids


#: What an SGLang server's information endpoint says about how it computes (SGLang 0.5.23 server-argument names):
#: recorded in every header (``model.server``) so that a figure can be traced to the configuration behind it.
SERVER_FACTS = ("version", "model_path", "served_model_name", "dtype", "quantization", "kv_cache_dtype",
                "context_length", "tp_size", "attention_backend", "disable_radix_cache", "chunked_prefill_size",
                "enable_deterministic_inference", "sampling_defaults", "mamba_radix_cache_strategy",
                "mamba_track_interval", "mamba_max_states_per_path", "mem_fraction_static", "reasoning_parser")
#: Of those, what changes the numbers themselves (ours): runs whose servers differ here are never pooled.
NUMBER_FACTS = ("model_path", "dtype", "quantization", "kv_cache_dtype", "enable_deterministic_inference")


async def server_facts(b, root: str) -> dict | None:
    """SERVER_FACTS of an SGLang server (``/server_info``, else the older ``/get_server_info``); None: unknown."""
    for path in ("/server_info", "/get_server_info"):
        try:
            info = await request_json(b._client, "GET", root + path, headers=getattr(b, "_headers", None),
                                      policy=PREFLIGHT_POLICY, what="server info")
        except HTTPError:
            continue
        if isinstance(info, dict) and "enable_deterministic_inference" in info:
            return {k: info[k] for k in SERVER_FACTS if k in info}
    return None


def server_differences(recorded: dict | None, current: dict | None, *, unverified_ok: bool = False) -> str | None:
    """How two model identities' servers differ in what changes the numbers; None when they do not. Where one side
    recorded a fact the other cannot say (a server whose ``/server_info`` answers 404, or lacks the field), the two
    cannot be told apart: that is a difference too (:func:`unverified_facts`), unless ``unverified_ok``."""
    a, b = (recorded or {}).get("server") or {}, (current or {}).get("server") or {}
    diff = [f"{k}: {a[k]!r} vs {b[k]!r}" for k in NUMBER_FACTS if k in a and k in b and a[k] != b[k]]
    if diff:
        return "the servers differ in " + "; ".join(diff)
    return None if unverified_ok else unverified_facts(recorded, current)


def unverified_facts(recorded: dict | None, current: dict | None) -> str | None:
    """Why two servers cannot be compared on what changes the numbers: one recorded its facts and the other gave
    none, or one names a fact (``dtype``, ``quantization``…) the other does not; None when both say the same
    facts or neither says any (a scripted or in-process backend, a server that never exposes them)."""
    a, b = (recorded or {}).get("server") or {}, (current or {}).get("server") or {}
    if not a and not b:
        return None
    if not a or not b:
        which = "this server gives" if a else "the run recorded"
        return (f"the servers cannot be compared: {which} none of the facts that change the numbers (its "
                "/server_info did not answer)")
    missing = [k for k in NUMBER_FACTS if (k in a) != (k in b)]
    if missing:
        return f"the servers cannot be compared: only one of them says {', '.join(missing)}"
    return None


def deterministic_cost(facts: dict | None) -> str | None:
    """A warning when a server runs deterministic inference with its radix cache off (SGLang 0.5.23 turns it off
    unless the attention backend is one it lists, ``attention_hook.py`` ``handle_deterministic_inference``)."""
    f = facts or {}
    if f.get("enable_deterministic_inference") and f.get("disable_radix_cache"):
        return (f"the server runs deterministic inference on the {f.get('attention_backend')!r} attention backend, so "
                "SGLang turned its radix cache off: no prefix is reused and every request pays its whole prompt's "
                "prefill (a probe several times over). Serve with --attention-backend fa3 (Hopper) or triton, which "
                "keep it (docs/serving.md)")
    return None


async def _openai_identity(b) -> dict:
    url = b.base + "/models"
    ids = _ids(await _get(b, url, "list models"), url)
    if b.model and b.model not in ids:
        raise PreflightError(f"{public_url(b.base)} does not serve {b.model!r}; it serves {', '.join(ids[:10])}")
    b.model = b.model or ids[0]
    facts = await server_facts(b, b.base.removesuffix("/v1")) if b.server == "sglang" else None
    if b.server == "vllm":  # what vLLM exposes: its version
        try:
            facts = {"version": (await _get(b, b.base.removesuffix("/v1") + "/version", "server version")).get("version")}
        except (PreflightError, AttributeError):
            facts = None
    return {"backend": f"openai:{b.server}", "served_model": b.model, "weights": None, "fingerprint": None,
            "deterministic": None if facts is None else facts.get("enable_deterministic_inference"), "server": facts}


async def _sglang_identity(b) -> dict:
    root = b.url.removesuffix("/generate")
    ids = _ids(await _get(b, root + "/v1/models", "list models"), root + "/v1/models")
    try:  # the same question the runner asks after each trajectory (a redeployed server, F6)
        weights = await b.served_weights(policy=PREFLIGHT_POLICY)
    except BackendError as e:
        raise PreflightError(f"the model server is unreachable or refused: {e}") from None
    if b.model_arg and b.model_arg not in ids:
        raise PreflightError(f"{public_url(root)} does not serve {b.model_arg!r}; it serves {', '.join(ids[:10])}")
    served = b.model_arg or ids[0]
    b.model = served  # records name the model the server really serves
    if b.model_dir_name and weights and Path(str(weights).rstrip("/")).name.lower() != b.model_dir_name.lower():
        raise PreflightError(
            f"{public_url(root)} serves the weights {weights!r} but --model-dir is {b.model_dir!s}: the prompts would be "
            "rendered with another model's chat template and the records would name the wrong model")
    facts = await server_facts(b, root)
    return {"backend": "sglang", "served_model": served, "weights": weights, "fingerprint": None,
            "deterministic": None if facts is None else facts.get("enable_deterministic_inference"), "server": facts}


def same_model(recorded: dict | None, current: dict | None) -> str | None:
    """None when both identities describe the same model, else a sentence saying how they differ."""
    if not recorded or not current:
        return None if recorded == current else "the run records no model identity"
    if recorded.get("fingerprint") and current.get("fingerprint"):
        if recorded["fingerprint"] == current["fingerprint"]:
            return None
        return (f"the run was recorded by {recorded.get('served_model')} ({recorded.get('weights')}, fingerprint "
                f"{recorded['fingerprint']}) but this would query {current.get('served_model')} "
                f"({current.get('weights')}, fingerprint {current['fingerprint']})")

    def name(x):
        w = x.get("weights")
        return (Path(str(w).rstrip("/")).name if w else x.get("served_model") or "").lower()
    if name(recorded) and name(recorded) == name(current):
        return None
    return (f"the run was recorded by {recorded.get('served_model')!r} (weights {recorded.get('weights')}) but this "
            f"would query {current.get('served_model')!r} (weights {current.get('weights')})")


def require_keys(needs: dict[str, str]) -> None:
    """``needs``: {ENV_VAR: what needs it}; raises naming every missing variable."""
    missing = [f"{k} ({why})" for k, why in needs.items() if k and not os.environ.get(k)]
    if missing:
        raise PreflightError("missing API key(s) in the environment: " + "; ".join(missing))


def check_benchmark_images(manifest, samples, *, allow_missing: bool = False):
    """(usable samples, skipped [(sample id, reason)]): every query image must load as an image.

    Refuses (PreflightError) when any image is missing, unreadable or not an image, unless
    ``allow_missing``: then the samples with a bad image are left out, and the caller says how many.
    """

    bad: list[tuple[str, str]] = []
    keep = []
    for s in samples:
        why = None
        for p in s.image_paths:
            try:
                load_image(p)
            except ImageError as e:
                why = str(e)
                break
        if why is None:
            keep.append(s)
        else:
            bad.append((s.id, why))
    if bad and not allow_missing:
        head = "; ".join(f"{i}: {w}" for i, w in bad[:5])
        raise PreflightError(f"{manifest.path}: {len(bad)} of {len(samples)} samples have a missing or unreadable "
                             f"query image ({head}{' …' if len(bad) > 5 else ''}). Run python -m agent.benchmarks "
                             f"stats {Path(manifest.path).parent.parent} for the full list, or pass "
                             "--allow-missing-images to run the others")
    return keep, bad


def describe(ident: dict | None) -> str:
    if not ident:
        return "unknown model"
    return json.dumps({k: v for k, v in ident.items() if v is not None}, sort_keys=True)


def main(argv=None) -> int:
    """``python -m agent.preflight``: every check a chain of commands needs, before the first one starts.

    Used by ``scripts/reproduce_figure2.sh``; exit 0 when everything a later stage needs is in place, 2 (with
    every problem listed) otherwise.
    """


    ap = make_parser("python -m agent.preflight", main.__doc__, [
        "python -m agent.preflight --benchmark DATA/mmsearch --backend sglang --endpoint http://gpu:30000 "
        "--model-dir /models/Qwen3.5-27B --tools live --judge-api-key-env OPENROUTER_API_KEY",
        "python -m agent.preflight --benchmark demo --backend local"])
    ap.add_argument("--benchmark", help="a benchmark dir whose images must all load (default: none checked)")
    ap.add_argument("--tools", choices=("offline", "live"), default="offline",
                    help="live: the search / visit / lens keys and the lens image-URL configuration")
    ap.add_argument("--judge-api-key-env", action="append", default=[], metavar="VAR",
                    help="an API key a judge or annotator stage needs (repeatable)")
    add_backend_args(ap, default=None, repeat_endpoint=True,
                     title="the model server to check (default: none; several --endpoint must serve one model)")
    a = ap.parse_args(argv)
    problems = []
    if a.tools == "live":
        try:
            require_live_tools(("search", "visit", "lens_search"))
        except MissingKeyError as e:
            problems.append(str(e))
    try:
        require_keys({v: "judge / annotator" for v in a.judge_api_key_env})
    except PreflightError as e:
        problems.append(str(e))
    if a.benchmark:
        try:
            m = resolve_benchmark(a.benchmark)
            check_benchmark_images(m, m.samples)
        except (PreflightError, FileNotFoundError) as e:
            problems.append(str(e))
    if a.backend:
        async def ident(endpoint):
            b = make_backend(a.backend, endpoint=endpoint, model=a.model, model_dir=a.model_dir,
                             logprob_mode=a.logprob_mode, server=a.server, api_key_env=a.api_key_env)
            try:
                return await model_identity(b)
            finally:
                await b.aclose()
        seen = {}
        for ep in a.endpoint or [None]:
            try:
                idn = asyncio.run(ident(ep))
                print(f"model{' at ' + ep if ep else ''}: {describe(idn)}")
                seen[ep] = idn
            except (PreflightError, BackendError) as e:
                problems.append(str(e))
        served = {(i.get("served_model"), i.get("weights")) for i in seen.values()}
        if len(served) > 1:
            problems.append("the --endpoint servers serve different models: "
                            + "; ".join(f"{ep}: {describe(i)}" for ep, i in seen.items()))
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if problems:
        print(f"preflight: {len(problems)} problem(s); nothing was started", file=sys.stderr)
        return 2
    checked = [x for x, on in (("live tool keys", a.tools == "live"), ("judge keys", bool(a.judge_api_key_env)),
                               (f"benchmark {a.benchmark}", bool(a.benchmark)), ("model server", bool(a.backend))) if on]
    if not checked:  # nothing asked: say so rather than a bare "ok"
        print("preflight: nothing to check — give --benchmark DIR, --backend … --endpoint URL, --tools live or "
              "--judge-api-key-env VAR (see --help)")
        return 0
    print(f"preflight: ok ({', '.join(checked)})")
    done([], "start the run or chain these flags describe (bash scripts/reproduce_figure2.sh runs this check itself)")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
