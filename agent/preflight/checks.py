"""The work of ``python -m agent.preflight`` once its arguments parse: agent/preflight/cli.py holds the flags, the
package's docstring says what it does and writes."""
from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import replace
from pathlib import Path

from ..backends import BackendError, make_backend
from ..backends.spread import Spread
from ..benchmarks import resolve_benchmark
from ..cli import done
from ..errors import UsageError
from ..http import HTTPError, RetryPolicy, request_json
from ..identity import SERVER_FACTS, local_identity, same_model
from ..images import ImageError, load_image
from ..redact import public_url
from ..tools.live import MissingKeyError, require_live_tools

log = logging.getLogger(__name__)

__all__ = ["PreflightError", "model_identity", "require_keys", "check_benchmark_images", "PREFLIGHT_POLICY",
           "server_facts", "context_limit", "check_output_room"]

#: A preflight request fails fast: one retry, 15 s.
PREFLIGHT_POLICY = RetryPolicy(retries=1, backoff_s=0.5, timeout_s=15.0)


class PreflightError(UsageError, RuntimeError):
    """A check before the work failed: nothing was done."""


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
    if kind in ("openai", "vllm"):
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


async def _openai_identity(b) -> dict:
    url = b.base + "/models"
    data = await _get(b, url, "list models")
    ids = _ids(data, url)
    if b.model and b.model not in ids:
        raise PreflightError(f"{public_url(b.base)} does not serve {b.model!r}; it serves {', '.join(ids[:10])}")
    b.model = b.model or ids[0]
    if b.server == "vllm":
        return await _vllm_identity(b, next(m for m in data["data"] if m.get("id") == b.model))
    facts = await server_facts(b, b.base.removesuffix("/v1")) if b.server == "sglang" else None
    return {"backend": f"openai:{b.server}", "served_model": b.model, "weights": None, "fingerprint": None,
            "deterministic": None if facts is None else facts.get("enable_deterministic_inference"), "server": facts}


async def _vllm_identity(b, listed: dict) -> dict:
    """What vLLM says of itself: its ``/v1/models`` entry names the served weights (``root``: the path or hub id it
    loaded) and the context (``max_model_len``), ``/version`` its version. The weights are recorded, so that a
    resume or a probe against other weights under the same name is refused (:func:`agent.identity.same_model`)."""
    weights = listed.get("root") if isinstance(listed.get("root"), str) else None
    facts: dict = {"model_path": weights}
    if isinstance(listed.get("max_model_len"), int):
        facts["max_model_len"] = listed["max_model_len"]
    try:
        facts["version"] = (await _get(b, b.base.removesuffix("/v1") + "/version", "server version")).get("version")
    except (PreflightError, AttributeError):
        pass
    _same_weights(b, weights, public_url(b.base))
    return {"backend": "vllm", "served_model": b.model, "weights": weights, "fingerprint": None, "deterministic": None,
            "server": facts}


def _same_weights(b, weights, where: str) -> None:
    """A server whose weights are not those of ``--model-dir`` would be sent prompts rendered with another model's
    chat template, and its records would name the wrong model."""
    name = getattr(b, "model_dir_name", None)
    if name and weights and Path(str(weights).rstrip("/")).name.lower() != name.lower():
        raise PreflightError(
            f"{where} serves the weights {weights!r} but --model-dir is {getattr(b, 'model_dir', name)!s}: the prompts "
            "would be rendered with another model's chat template and the records would name the wrong model")


def context_limit(ident: dict | None) -> int | None:
    """The longest sequence (prompt and output) the server takes: vLLM's ``max_model_len``, SGLang's
    ``context_length``; None when it does not say."""
    facts = (ident or {}).get("server") or {}
    n = facts.get("max_model_len", facts.get("context_length"))
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def check_output_room(ident: dict | None, max_tokens: int | None, flag: str = "--max-tokens") -> None:
    """Refuse, before any work, an output length the server cannot give a single call: every request would be
    refused (vLLM: HTTP 400, "max_tokens ... cannot be greater than max_model_len"). A call whose prompt leaves less
    room is fitted by the server itself and ends by length, which the record says."""
    limit = context_limit(ident)
    if limit is not None and max_tokens is not None and max_tokens >= limit:
        raise PreflightError(f"{flag} {max_tokens} leaves no room for a prompt: the server takes at most {limit} tokens "
                             f"in all (its max_model_len / context length); give {flag} below {limit} (the paper's "
                             "8192 needs a server started with a longer context: --context-length)")


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
    _same_weights(b, weights, public_url(root))
    facts = await server_facts(b, root)
    return {"backend": "sglang", "served_model": served, "weights": weights, "fingerprint": None,
            "deterministic": None if facts is None else facts.get("enable_deterministic_inference"), "server": facts}


def require_keys(needs: dict[str, str]) -> None:
    """``needs``: {ENV_VAR: what needs it}; raises naming every missing variable."""
    missing = [f"{k} ({why})" for k, why in needs.items() if k and not os.environ.get(k)]
    if missing:
        raise PreflightError("missing API key(s) in the environment: " + "; ".join(missing))


def check_benchmark_images(manifest, samples, *, allow_missing: bool = False, drop_missing: bool = False):
    """(usable samples, skipped [(sample id, reason)]): every query image must load as an image.

    Refuses (PreflightError) when any image is missing, unreadable or not an image, unless
    ``allow_missing``: then the samples with a bad image are left out, and the caller says how many.
    ``drop_missing`` (``--protocol release``): an image whose file does not exist is dropped and the sample runs with
    the rest, renumbered, as the release does (``pipelines/base_pipeline.py``, ``_prepare_images``); the names go to
    ``sample.extra["dropped_images"]``. With both, a file that exists but is no image is kept and sent as the release
    sends it (its bytes; the server cannot decode them and the call carrying it fails, as there); the names go to
    ``sample.extra["undecodable_images"]``. Otherwise such a file is refused (ours: nothing can be learnt from it).
    """

    bad: list[tuple[str, str]] = []
    keep = []
    for s in samples:
        gone = [f for f, p in zip(s.query_images, s.image_paths) if drop_missing and not os.path.exists(p)]
        extra = {k: v for k, v in s.extra.items() if k not in ("dropped_images", "undecodable_images")}
        if gone:
            s = replace(s, query_images=[f for f in s.query_images if f not in gone], extra={**extra, "dropped_images": gone})
        else:
            s = replace(s, extra=extra)
        why, undecodable = None, []
        for f, p in zip(s.query_images, s.image_paths):
            try:
                if not load_image(p, undecodable_ok=drop_missing and allow_missing).decoded:
                    undecodable.append(f)
            except ImageError as e:
                why = str(e)
                break
        if why is None:
            keep.append(replace(s, extra={**s.extra, "undecodable_images": undecodable}) if undecodable else s)
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


def preflight_command(a) -> int:
    """``python -m agent.preflight`` once its arguments parse."""
    a.logprob_mode = a.logprob_mode or ("raw" if a.backend == "vllm" else "scaled")
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
        log.error(f"error: {p}")
    if problems:
        log.info(f"preflight: {len(problems)} problem(s); nothing was started")
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


