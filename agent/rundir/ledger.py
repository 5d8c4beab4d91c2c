"""What a run cost: tokens and GPU-seconds per model, paid and cached tool calls per tool API, the judges' tokens,
and money from a price table (ours; issue 26).

    python -m agent.ledger RUN_DIR [RUN_DIR ...] [--prices prices.json] [--serve-dir DIR] [--gpus-per-server N]

Written as ``RUN_DIR/ledger.json`` (by the runner after every invocation, by ``agent.rundir merge``, and by this
command, which also prints it); ``python -m analysis.report`` prints it beside Table 4; ``python -m agent.run
--dry-run`` projects a planned run from a pilot run's ledger.

Per model (the runner's LLM calls): calls, prompt / cached / completion tokens, the summed request latency and
**request GPU-seconds** = each call's latency × the GPUs of the serving group behind its endpoint (from the
launcher's ``endpoints.json``: serving/endpoints.py; a router counts one worker group), and **held
GPU-seconds** = the run's span (first start to last finish, per invocation is not recorded, so the whole
span) × the GPUs behind its endpoints (a router's: all its workers'). Requests are batched, so request GPU-seconds over-count what the GPUs were
busy with; held GPU-seconds are what the reservation cost. Both are null when the GPUs are unknown, never 0.
Per tool: calls, those answered from the tool cache, and the paid API calls (a cache miss that reached a paid
API; the offline world pays none). Per judge file: calls and tokens of the LLM judge.

Money (ours): a price table, ``DEFAULT_PRICES`` below or ``--prices FILE`` (the same layout; entries merge
over the defaults). A price that is not known is null and its money is shown as unknown — never as 0 — and
the total is unknown whenever any part is (the ``unknown`` list says which).
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

from serving.endpoints import gpus_behind, gpus_held

from ..images import ImageError, load_image
from ..tools.cache import ToolCache, cache_key
from .common import write_json
from .grades import read_grades
from .reader import load_run

__all__ = ["DEFAULT_PRICES", "load_prices", "compute_ledger", "write_ledger", "PAPER_TABLE4", "project",
           "cached_query_lens", "format_ledger", "format_projection"]

#: Prices in USD. Each entry carries where it comes from and when it was read; null = not known here (set it
#: with --prices). The toolkit's own models are self-hosted: their cost is GPU time (gpu_hour).
DEFAULT_PRICES = {
    "models": {
        "google/gemini-3-flash-preview": {
            "input_per_1m": 0.50, "output_per_1m": 3.00, "cached_input_per_1m": None,
            "source": "Google's Gemini API price list for Gemini 3 Flash (https://ai.google.dev/gemini-api/docs/"
                      "pricing), as quoted by a reseller's comparison page; OpenRouter may differ",
            "as_of": "2026-12-01"},
    },
    "tools": {
        "search": {"per_call": None, "source": "Serper /search: set your plan's price per query "
                                               "(serper.dev sells credit packs whose unit price falls with volume)"},
        "lens_search": {"per_call": None, "source": "Serper /lens: set your plan's price per query"},
        "visit": {"per_call": None, "source": "the page reader (Jina Reader, or Serper scrape as the fallback): "
                                              "set the price per paid call"},
    },
    "gpu_hour": {"price": None, "source": "your cluster's price of one GPU-hour (set it with --prices)"},
}

#: Paper Table 4 (§4.4 text): cumulative tokens per sample, averaged over five backbones and seven benchmarks.
#: What agent.run --dry-run projects from when there is no pilot run (tokens only: the paper gives no GPU time,
#: and its tool-call counts per method are not in the text).
PAPER_TABLE4 = {"react": {"cumulative_tokens": 54_600, "working_context": 8_800},
                "contextfold": {"cumulative_tokens": 49_600, "working_context": 7_700},
                "agentfold": {"cumulative_tokens": 16_000, "working_context": 3_400},
                "mmcontextfold": {"cumulative_tokens": 44_100, "working_context": 6_400}}


def load_prices(path=None) -> dict:
    """The default table with ``path``'s entries merged over it (a missing or malformed file is an error)."""

    prices: dict = copy.deepcopy(DEFAULT_PRICES)
    if not path:
        return prices
    try:
        given = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such price file") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: unreadable price file ({e})") from None
    if not isinstance(given, dict):
        raise ValueError(f"{path}: a price file is a JSON object (see agent/rundir/ledger.py DEFAULT_PRICES)")
    for section in ("models", "tools"):
        for k, v in (given.get(section) or {}).items():
            if not isinstance(v, dict):
                raise ValueError(f"{path}: {section}.{k} must be an object")
            prices[section][k] = {**prices[section].get(k, {}), **v, "source": v.get("source", f"{path}")}
    if "gpu_hour" in given:
        g = given["gpu_hour"]
        prices["gpu_hour"] = {**prices["gpu_hour"], **(g if isinstance(g, dict) else {"price": g}),
                              "source": (g.get("source") if isinstance(g, dict) else None) or str(path)}
    prices["file"] = str(path)
    return prices


def _gpus_for(url: str | None, serving_dir, gpus_per_server, cache: dict, held: bool = False):
    """GPUs one request runs on, or (``held``) all those behind the URL (a router: its every worker)."""
    if gpus_per_server:
        return gpus_per_server
    if not url or url in ("scripted", "local") or not str(url).startswith("http"):
        return None
    key = (url, held)
    if key not in cache:
        cache[key] = (gpus_held if held else gpus_behind)(url, serving_dir)
    return cache[key]


def _money(*parts):
    """Sum of money parts; None when any is None."""
    return None if any(p is None for p in parts) else round(sum(parts), 6)


def _count(run, serving_dir, gpus_per_server, cache: dict) -> tuple[dict, dict, set, float]:
    """Per model (calls, tokens, latency, request GPU-seconds) and per tool (calls, cached, paid) over the run's
    lines; the endpoints seen and the run's span (first start to last finish)."""
    models: dict = {}
    tools: dict = {}
    endpoints: set = set()
    t0 = t1 = None
    for s in run.index:
        t0 = s.started if t0 is None else min(t0, s.started)
        t1 = s.finished if t1 is None else max(t1, s.finished)
        m = models.setdefault(s.model or "?", {"calls": 0, "prompt_tokens": 0, "cached_tokens": 0,
                                                      "completion_tokens": 0, "latency_s": 0.0,
                                                      "request_gpu_seconds": 0.0, "_gpus_unknown": 0,
                                                      "provider_cost": 0.0, "calls_with_cost": 0})
        url = s.endpoint
        endpoints.add(url)
        gpus = _gpus_for(url, serving_dir, gpus_per_server, cache)
        for c in s.calls:
            m["calls"] += 1
            m["prompt_tokens"] += c.prompt_tokens
            m["cached_tokens"] += c.cached_tokens
            m["completion_tokens"] += c.completion_tokens
            if c.cost is not None:  # what the provider said this call cost
                m["provider_cost"] += c.cost
                m["calls_with_cost"] += 1
            lat = c.latency_s
            m["latency_s"] += lat
            if gpus is None:
                m["_gpus_unknown"] += 1
            else:
                m["request_gpu_seconds"] += lat * gpus
        for name, u in s.tool_usage.items():
            t = tools.setdefault(name, {"calls": 0, "cached": 0, "paid_calls": 0})
            t["calls"] += u.calls
            t["cached"] += u.cached
            t["paid_calls"] += u.paid
    span = (t1 - t0) if t0 is not None and t1 is not None else 0.0
    return models, tools, endpoints, span


def _price_models(models: dict, prices: dict, held_gpus, span: float, unknown: list) -> None:
    """Held GPU-seconds and money per model: by tokens for a priced API model, else by held GPU-hours."""
    gpu_price = (prices.get("gpu_hour") or {}).get("price")
    for name, m in models.items():
        if m.pop("_gpus_unknown"):
            m["request_gpu_seconds"] = None
        m["latency_s"] = round(m["latency_s"], 3)
        if m["request_gpu_seconds"] is not None:
            m["request_gpu_seconds"] = round(m["request_gpu_seconds"], 3)
        m["held_gpu_seconds"] = round(span * sum(held_gpus), 3) if held_gpus and None not in held_gpus else None
        price = (prices.get("models") or {}).get(name)
        m["provider_cost"] = round(m["provider_cost"], 6) if m["calls_with_cost"] else None
        if m["calls"] and m["calls_with_cost"] == m["calls"]:  # the provider's own bill for every call
            m["money"], m["priced_by"] = m["provider_cost"], "provider-reported cost (usage.cost)"
        elif price:  # an API model priced per token
            pin, pout, pcached = price.get("input_per_1m"), price.get("output_per_1m"), price.get("cached_input_per_1m")
            pcached = pin if pcached is None else pcached
            m["money"] = None if pin is None or pout is None else round(
                ((m["prompt_tokens"] - m["cached_tokens"]) * pin + m["cached_tokens"] * pcached
                 + m["completion_tokens"] * pout) / 1e6, 6)
            m["priced_by"] = "tokens"
        else:  # self-hosted: GPU time
            m["money"] = None if gpu_price is None or m["held_gpu_seconds"] is None else \
                round(m["held_gpu_seconds"] / 3600 * gpu_price, 6)
            m["priced_by"] = "held GPU-hours"
        if m["money"] is None and m["calls"]:
            unknown.append(f"model {name}: " + ("no GPU-hour price" if gpu_price is None and not price else
                                                "GPUs behind its endpoints unknown" if not price else "a token price"))


def _judges(run_path: Path, prices: dict, unknown: list) -> dict:
    """Per judge file: its LLM calls, tokens and money."""
    judges: dict = {}
    for f in sorted(Path(run_path).glob("judge-*.jsonl")):
        used = [(r, r.usage) for r in read_grades(f) if r.usage]
        if not used:
            continue
        model = next((r.judge_served_model for r, _ in used if r.judge_served_model), None) or used[0][0].judge
        j = {"file": f.name, "model": model, "calls": len(used),
             "prompt_tokens": sum(int(u.get("prompt_tokens") or 0) for _, u in used),
             "completion_tokens": sum(int(u.get("completion_tokens") or 0) for _, u in used)}
        costs = [u["cost"] for _, u in used if u.get("cost") is not None]
        price = (prices.get("models") or {}).get(model) or {}
        if len(costs) == len(used):  # the provider's own bill for every grade
            j["money"], j["priced_by"] = round(sum(costs), 6), "provider-reported cost (usage.cost)"
        else:
            j["money"] = None if price.get("input_per_1m") is None or price.get("output_per_1m") is None else round(
                j["prompt_tokens"] * price["input_per_1m"] / 1e6 + j["completion_tokens"] * price["output_per_1m"] / 1e6, 6)
        if j["money"] is None:
            unknown.append(f"judge {model}: no token price")
        judges[f.name] = j
    return judges


def compute_ledger(run_dir, *, prices: dict | None = None, serving_dir=None, gpus_per_server: int | None = None) -> dict:
    prices = prices or load_prices()
    run = load_run(run_dir)
    cache: dict = {}
    models, tools, endpoints, span = _count(run, serving_dir, gpus_per_server, cache)
    servers = [e for e in endpoints if e]
    unknown: list[str] = []
    held = [_gpus_for(u, serving_dir, gpus_per_server, cache, held=True) for u in servers]
    _price_models(models, prices, held, span, unknown)
    for name, t in tools.items():
        per = ((prices.get("tools") or {}).get(name) or {}).get("per_call")
        t["price_per_call"] = per
        t["money"] = 0.0 if t["paid_calls"] == 0 else (None if per is None else round(t["paid_calls"] * per, 6))
        if t["money"] is None:
            unknown.append(f"tool {name}: no price per call")
    judges = _judges(run.path, prices, unknown)
    parts = [m["money"] for m in models.values()] + [t["money"] for t in tools.values()] + \
        [j["money"] for j in judges.values()]
    return {"run_dir": str(run.path), "computed": time.time(), "units": len(run.index), "span_s": round(span, 3),
            "servers": sorted(s for s in servers if s), "models": models, "tools": tools, "judges": judges,
            "total_money": _money(*parts) if parts else 0.0, "unknown": unknown,
            "prices": {"file": prices.get("file"), "gpu_hour": prices.get("gpu_hour"),
                       "used": {k: v for k, v in (prices.get("models") or {}).items()
                                if k in models or any(j["model"] == k for j in judges.values())}
                       | {f"tool:{k}": v for k, v in (prices.get("tools") or {}).items() if k in tools}}}


def write_ledger(run_dir, **kw) -> dict:
    led = compute_ledger(run_dir, **kw)
    write_json(Path(run_dir) / "ledger.json", led, indent=2)
    return led


def _per_unit(led: dict) -> dict:
    n = max(int(led.get("units") or 0), 1)
    tok = {k: sum(m[k] for m in led["models"].values()) / n for k in ("prompt_tokens", "cached_tokens",
                                                                     "completion_tokens")}
    gs = [m.get("held_gpu_seconds") for m in led["models"].values()]
    rq = [m.get("request_gpu_seconds") for m in led["models"].values()]
    billed = [m for m in led["models"].values() if m.get("priced_by", "").startswith("provider")]
    return {"units": led.get("units"), "tokens": tok,
            "provider_cost": sum(m["money"] for m in billed) / n if billed and len(billed) == len(led["models"]) else None,
            "held_gpu_seconds": None if not gs or any(g is None for g in gs) else sum(gs) / n,
            "request_gpu_seconds": None if not rq or any(g is None for g in rq) else sum(rq) / n,
            "tools": {k: {"calls": t["calls"] / n, "paid_share": t["paid_calls"] / t["calls"] if t["calls"] else 0.0}
                      for k, t in led["tools"].items()}}


def cached_query_lens(cache_path, samples) -> tuple[int, int]:
    """(query images whose first Lens search is already in the tool cache, query images): the exact keys the
    agents' ``lens_search(image_id="<image_i>")`` on each sample's query images would look up (the image's hash, or
    in an older cache the identifier's spelling)."""

    cache = ToolCache(cache_path)
    hit = n = 0
    try:
        for s in samples:
            for i, p in enumerate(getattr(s, "image_paths", []) or []):
                n += 1
                try:
                    sha = load_image(p).sha256
                except ImageError:
                    continue
                args = {"image_id": f"<image_{i}>"}
                hit += any(cache.get(cache_key("lens_search", args, sha, by_spelling=old)) is not None
                           for old in (False, True))
    finally:
        cache.close()
    return hit, n


def project(method: str, units: int, samples, *, pilot=None, cache_path=None, prices: dict | None = None) -> dict:
    """What ``units`` (sample, trial) units of ``method`` are expected to cost: from a pilot run's ledger (per-unit
    means of the same method), or else from the paper's Table 4 (tokens only); plus the existing tool cache's
    entries for the planned samples' query-image Lens searches."""
    prices = prices or load_prices()
    out: dict = {"method": method, "units": units, "basis": None, "tokens": None, "held_gpu_seconds": None,
                 "tools": {}, "money": None, "unknown": []}
    if pilot:
        led = json.loads((Path(pilot) / "ledger.json").read_text()) if (Path(pilot) / "ledger.json").exists() \
            else compute_ledger(pilot, prices=prices)

        pm = load_run(pilot).header.method
        if pm != method:
            raise ValueError(f"--pilot {pilot} ran {pm!r}, this run is {method!r}: a pilot projects its own method")
        pu = _per_unit(led)
        out["basis"] = f"pilot run {pilot} ({pu['units']} units)"
        out["tokens"] = {k: round(v * units) for k, v in pu["tokens"].items()}
        out["held_gpu_seconds"] = None if pu["held_gpu_seconds"] is None else round(pu["held_gpu_seconds"] * units, 1)
        gpu_price = (prices.get("gpu_hour") or {}).get("price")
        if pu["provider_cost"] is not None:  # the pilot's provider billed every call: its per-unit bill
            parts = [pu["provider_cost"] * units]
            out["model_money_basis"] = "the pilot's provider-reported cost per unit (usage.cost)"
        else:
            parts = [None if gpu_price is None or out["held_gpu_seconds"] is None else out["held_gpu_seconds"] / 3600 * gpu_price]
        if parts[0] is None:
            out["unknown"].append("GPU time: " + ("no GPU-hour price" if gpu_price is None else "the pilot's GPUs unknown"))
        for k, t in pu["tools"].items():
            calls = t["calls"] * units
            paid = calls * t["paid_share"]
            per = ((prices.get("tools") or {}).get(k) or {}).get("per_call")
            money = 0.0 if paid == 0 else (None if per is None else paid * per)
            if money is None:
                out["unknown"].append(f"tool {k}: no price per call")
            out["tools"][k] = {"calls": round(calls), "paid_calls": round(paid), "money": money}
            parts.append(money)
        out["money"] = _money(*parts)
    else:
        row = PAPER_TABLE4.get(method)
        out["basis"] = "paper Table 4 (§4.4: cumulative tokens per sample, averaged over 5 backbones, 7 benchmarks)"
        if row is None:
            out["unknown"].append(f"tokens: the paper's Table 4 has no {method!r} row; give --pilot RUN")
        else:
            out["tokens"] = {"cumulative_tokens": row["cumulative_tokens"] * units}
        out["unknown"] += ["GPU time and tool calls: the paper reports neither per method; give --pilot RUN"]
    if cache_path and Path(cache_path).exists():
        hit, n = cached_query_lens(cache_path, samples)
        out["cache"] = {"path": str(cache_path), "query_lens_cached": hit, "query_images": n}
    return out


def _usd(x) -> str:
    return "unknown" if x is None else f"${x:,.2f}"


def format_ledger(led: dict) -> list[str]:
    out = [f"cost ledger of {led['run_dir']} ({led['units']} units, span {led['span_s'] / 3600:.2f} h)"]
    out.append(f"{'model':<34} {'calls':>7} {'prompt':>12} {'cached':>12} {'completion':>12} {'req GPU-s':>11} "
               f"{'held GPU-s':>11} {'money':>10}")
    for name, m in led["models"].items():
        f = lambda v: "unknown" if v is None else f"{v:,.0f}"  # noqa: E731
        out.append(f"{name[:34]:<34} {m['calls']:>7} {m['prompt_tokens']:>12,} {m['cached_tokens']:>12,} "
                   f"{m['completion_tokens']:>12,} {f(m['request_gpu_seconds']):>11} {f(m['held_gpu_seconds']):>11} "
                   f"{_usd(m['money']):>10}")
    if led["tools"]:
        out.append(f"{'tool':<34} {'calls':>7} {'cached':>12} {'paid calls':>12} {'per call':>12} {'money':>10}")
        for name, t in sorted(led["tools"].items()):
            per = "unknown" if t["price_per_call"] is None else "$%.4f" % t["price_per_call"]
            out.append(f"{name:<34} {t['calls']:>7} {t['cached']:>12} {t['paid_calls']:>12} {per:>12} "
                       f"{_usd(t['money']):>10}")
    for j in led["judges"].values():
        out.append(f"judge {j['model']}: {j['calls']} calls, {j['prompt_tokens']:,} prompt + {j['completion_tokens']:,} "
                   f"completion tokens, {_usd(j['money'])}")
    out.append(f"total: {_usd(led['total_money'])}" + (f" (unknown: {'; '.join(led['unknown'])})" if led["unknown"] else ""))
    return out


def format_projection(p: dict) -> list[str]:
    out = [f"dry run: {p['units']} units of {p['method']}; projected from {p['basis']}"]
    if p["tokens"]:
        out.append("  tokens: " + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in p["tokens"].items()))
    if p.get("held_gpu_seconds") is not None:
        out.append(f"  held GPU time: {p['held_gpu_seconds'] / 3600:,.1f} GPU-hours")
    for k, t in sorted(p["tools"].items()):
        out.append(f"  {k}: {t['calls']:,} calls, {t['paid_calls']:,} paid (the pilot's share), {_usd(t['money'])}")
    c = p.get("cache")
    if c:
        out.append(f"  tool cache {c['path']}: the first Lens search of {c['query_lens_cached']} of the "
                   f"{c['query_images']} query images is already cached (free on this run)")
    out.append(f"  money: {_usd(p['money'])}" + (f" (unknown: {'; '.join(p['unknown'])})" if p["unknown"] else ""))
    out.append("  nothing was run or written (--dry-run)")
    return out
