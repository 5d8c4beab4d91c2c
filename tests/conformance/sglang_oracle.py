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
  model whose vision config holds those fields.

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


OPS = {"chat": _chat, "generate": _generate, "reasoning": _reasoning, "server_args": _server_args,
       "router_args": _router_args, "radix_deterministic": _radix_deterministic, "vlm_mem_fraction": _vlm_mem_fraction}


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
