"""SGLang's own code as an oracle: one JSON request per stdin line, one JSON answer per stdout line.

    PYTHONPATH=.venv-sglang/site python tests/conformance/sglang_oracle.py     # started by tests/conformance/conftest.py

Runs in its own process (SGLang's modules come from ``.venv-sglang/site``, built by
``scripts/sglang_conformance.sh``), so nothing SGLang imports can leak into the test process. Requests:

- ``{"op": "chat", "body": {...}}``: ``ChatCompletionRequest(**body)``;
- ``{"op": "generate", "body": {...}, "vocab_size": N}``: ``GenerateReqInput(**body)`` and
  ``SamplingParams(**body["sampling_params"]).verify(N)``; answers the effective sampling fields;
- ``{"op": "reasoning", "text": T, "force_reasoning": bool}``: ``ReasoningParser("qwen3")`` non-streaming;
- ``{"op": "server_args", "argv": [...]}``: SGLang's server argument parser (``ServerArgs.add_cli_args``);
- ``{"op": "router_args", "argv": [...]}``: smg's, the gateway (``RouterArgs``);
- ``{"op": "radix_deterministic"}``: the attention backends whose radix cache survives ``--deterministic``;
- ``{"op": "vlm_mem_fraction", "frac": F, "vision": {...}, "gpu_mem": MB}``: ``adjust_mem_fraction_for_vlm`` for a
  model whose vision config holds those fields;
- ``{"op": "hybrid_cache", "prompts": [[ids], ...], "grid": 64, "caps": [...], "state_slots": S}``: the prompts
  replayed through SGLang's UnifiedRadixCache with its Mamba component on CPU, one request running at a time, with a
  state pool of S slots when given (:func:`_hybrid_cache`);
- ``{"op": "mamba_slots", "strategy": "extra_buffer", "overlap": true}``: the linear-attention state slots one running
  request holds (counted off SGLang's own HybridReqToTokenPool as it allocates one) and those SGLang's scheduler
  reserves for each when it caps ``max_running_requests`` (:func:`_mamba_slots`).

Each answer is ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings

warnings.filterwarnings("ignore")


def _chat(req):
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    r = ChatCompletionRequest(**req["body"])
    return {"messages": [m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else m for m in r.messages],
            "logprobs": r.logprobs, "top_logprobs": r.top_logprobs, "top_k": r.top_k, "min_p": r.min_p,
            "repetition_penalty": r.repetition_penalty, "return_meta_info": getattr(r, "return_meta_info", None),
            "chat_template_kwargs": r.chat_template_kwargs, "seed": r.seed}


def _generate(req):
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    body = req["body"]
    gi = GenerateReqInput(**body)
    sp = SamplingParams(**(body.get("sampling_params") or {}))
    sp.verify(int(req.get("vocab_size", 248320)))
    return {"sampling": {k: getattr(sp, k) for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                                      "max_new_tokens", "sampling_seed", "skip_special_tokens")},
            "return_logprob": gi.return_logprob, "logprob_start_len": gi.logprob_start_len,
            "top_logprobs_num": gi.top_logprobs_num, "has_input_ids": gi.input_ids is not None,
            "has_text": gi.text is not None, "n_images": len(gi.image_data or []) if isinstance(gi.image_data, list) else 0}


def _reasoning(req):
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    p = ReasoningParser("qwen3", stream_reasoning=False, force_reasoning=bool(req.get("force_reasoning")))
    reasoning, normal = p.parse_non_stream(req["text"])
    return {"reasoning": reasoning, "normal": normal}


def _server_args(req):
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(p)
    a = p.parse_args(req["argv"])
    return {"args": {k: v for k, v in vars(a).items() if isinstance(v, (str, int, float, bool, type(None), list))}}


def _router_args(req):
    from smg.router_args import RouterArgs

    p = argparse.ArgumentParser(exit_on_error=False)
    RouterArgs.add_cli_args(p, use_router_prefix=False)
    r = RouterArgs.from_cli_args(p.parse_args(req["argv"]), use_router_prefix=False)
    return {"worker_urls": r.worker_urls, "policy": r.policy, "host": r.host, "port": r.port,
            "prometheus_port": r.prometheus_port, "routing_key_override": r.routing_key_override}


def _radix_deterministic(req):
    from sglang.srt.arg_groups.choices import RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND

    return {"backends": list(RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND)}


def _vlm_mem_fraction(req):
    from types import SimpleNamespace

    from sglang.srt.arg_groups.memory_hook import adjust_mem_fraction_for_vlm

    model = SimpleNamespace(hf_config=SimpleNamespace(vision_config=SimpleNamespace(**req["vision"])))
    return {"frac": adjust_mem_fraction_for_vlm(req["frac"], model, False, req["gpu_mem"])}


def _hybrid_cache(req):
    """Replay prompts (lists of token ids, in order) through SGLang's own UnifiedRadixCache with its Mamba component
    (the Qwen3.5 layout: full attention + linear attention), built by SGLang's test kit on CPU; per prompt the
    reused prefix SGLang's match gives (``device_prefix_len``) and its branch point. The match is SGLang's code;
    where the prefill then stores its one state is the scheduler's rule as probes/prefix_cache/ reads it
    (``_mamba_radix_cache_v2_req_prepare_for_extend``: the branch point first, else the grid's last multiple of the
    extend from the reused prefix), applied here by inserting the state at that depth. ``state_slots``: the Mamba
    state pool's size under ``extra_buffer``; each request takes its working slot and two ping-pong track slots at
    allocation (``HybridReqToTokenPool.alloc``), SGLang's own eviction frees what the pool lacks
    (``evict_for_alloc(mamba_num=...)``, its LRU over the tree's states) while the matched node is locked, and the
    finished request hands its tracked slot to the tree and frees the rest (``free_mamba_cache``)."""
    from array import array

    import sglang.test.kits.unified_radix_cache.fixtures as kit
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.test.kits.unified_radix_cache.config import CacheConfig

    kit.get_device = lambda *a, **k: "cpu"  # the kit's only accelerator assumption; the tree and pools run on CPU
    prompts, grid = req["prompts"], int(req.get("grid", 64))
    caps = req.get("caps") or [None] * len(prompts)  # a scoring request's logprob_start_len
    total = 2 * sum(len(p) for p in prompts) + 16  # each prompt allocates its KV again (nothing is freed here)
    slots = req.get("state_slots") or 3 * len(prompts) + 8  # unbounded: never short
    cfg = CacheConfig(components=(ComponentType.FULL, ComponentType.MAMBA), kv_size=total, max_context_len=max(
        len(p) for p in prompts) + 16, mamba_cache_size=slots, max_num_reqs=len(prompts) + 8,
        enable_mamba_extra_buffer=True)
    cache, allocator, pool = kit.build_fixture(cfg, mamba_cache_chunk_size=grid)
    need = 1 + pool.mamba_initial_tracking_slots  # a running request's working state and its track buffers

    out = []
    for i, p in enumerate(prompts):
        limit = max(len(p) - 1, 0) if caps[i] is None else max(min(len(p) - 1, caps[i]), 0)
        m = kit.match_prefix(cache, p[:limit])  # _compute_max_prefix_len: the last token, logprob_start_len
        reused, branch = int(m.device_prefix_len), m.mamba_branching_seqlen
        r = Req(rid=f"s{i}", origin_input_text="", origin_input_ids=array("q"),
                sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
        lock = cache.inc_lock_ref(m.last_device_node)  # the running request holds its matched node
        short = need - pool.mamba_allocator.available_size()
        if short > 0:
            cache.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=short))
        pool.alloc([r])
        cache.dec_lock_ref(m.last_device_node, lock.to_dec_params())
        extend = len(p) - reused
        track = None
        if branch is not None and reused < int(branch) < len(p):
            track = int(branch)
        elif extend >= grid:
            track = reused + extend // grid * grid
        keep = None
        if track is not None:  # a finished request donates its KV only up to its tracked state (mamba.py
            seq = p[:track]    # _select_finished_checkpoint: the key is cut to mamba_last_track_seqlen)
            res = cache.insert(InsertParams(key=RadixKey(array("q", seq)), value=allocator.alloc(len(seq)),
                                            mamba_value=r.kv.mamba_ping_pong_track_buffer[0:1]))
            keep = None if res.mamba_exist else 0  # the tree took the tracked slot unless it held that state
        pool.free_mamba_cache(r, mamba_ping_pong_track_buffer_to_keep=keep)
        pool.free(r)
        out.append({"reused": reused, "branch": None if branch is None else int(branch), "track": track,
                    "states": slots - pool.mamba_allocator.available_size()})
    return {"requests": out}


def _mamba_slots(req):
    """``held``: the pool's free slots before and after ``HybridReqToTokenPool.alloc`` of one request (its working
    state and its ping-pong track buffers; the pool as the kit builds it, with the overlap schedule on, as the
    launcher runs it); ``admitted``: ``KVCacheConfigurator._calculate_mamba_ratio`` under the
    strategy and overlap schedule given, the divisor of ``resolve_max_num_reqs``'s cap (the radix cache on)."""
    from array import array

    import sglang.test.kits.unified_radix_cache.fixtures as kit
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.runtime_context import get_context
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.test.kits.unified_radix_cache.config import CacheConfig

    strategy, overlap = req.get("strategy", "extra_buffer"), bool(req.get("overlap", True))
    fields = {"mamba_radix_cache_strategy": strategy, "disable_overlap_schedule": not overlap}
    scope = get_context().override_server_args(**fields)
    scope.install()
    try:
        admitted = KVCacheConfigurator._calculate_mamba_ratio(None)  # reads only the published config
    finally:
        scope.restore()
    kit.get_device = lambda *a, **k: "cpu"
    cfg = CacheConfig(components=(ComponentType.FULL, ComponentType.MAMBA), kv_size=256, max_context_len=128,
                      mamba_cache_size=16, max_num_reqs=4, enable_mamba_extra_buffer=strategy != "no_buffer")
    _, _, pool = kit.build_fixture(cfg, mamba_cache_chunk_size=64)
    free = pool.mamba_allocator.available_size()
    pool.alloc([Req(rid="r", origin_input_text="", origin_input_ids=array("q"),
                    sampling_params=SamplingParams(temperature=0, max_new_tokens=1))])
    return {"held": free - pool.mamba_allocator.available_size(), "admitted": int(admitted)}


OPS = {"chat": _chat, "generate": _generate, "reasoning": _reasoning, "server_args": _server_args,
       "router_args": _router_args, "radix_deterministic": _radix_deterministic, "vlm_mem_fraction": _vlm_mem_fraction,
       "hybrid_cache": _hybrid_cache, "mamba_slots": _mamba_slots}


def main() -> None:
    import sglang  # noqa: F401  (fail at start, not on the first request)

    print(json.dumps({"ok": True, "ready": True, "sglang": __import__("importlib.metadata").metadata.version("sglang")}),
          flush=True)
    for raw in sys.stdin:
        if not raw.strip():
            continue
        req = json.loads(raw)
        try:
            out = {"ok": True, **OPS[req["op"]](req)}
        except SystemExit as e:  # argparse errors
            out = {"ok": False, "error": f"argument error (exit {e.code})"}
        except Exception as e:  # noqa: BLE001 - SGLang's verdict is the answer
            out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    main()
