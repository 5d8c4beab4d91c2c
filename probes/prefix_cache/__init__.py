"""What a probe's request order costs a server's prefix cache, measured without a GPU.

    python -m probes.prefix_cache RUN_DIR [--mode regenerate|teacher-forced] [--model-dir DIR]
        [--capacity-tokens 1000000] [--servers 2] [--concurrency 128]

SGLang keeps the KV of recent prompts in a radix tree (its RadixCache: token-level, least recently used
leaves evicted when the KV pool fills); a request pays prefill only for the tokens after its longest cached
prefix. A probe sends each trajectory's steps, whose prompts extend one another, so how requests are ordered
and spread over servers decides how much prefill is paid. This replays the exact token streams the entropy
probe sends for a run (rendered with the model's own chat template; each image a block of tokens named by its
sha256, as SGLang's multimodal cache keys them) through one simulated radix cache per server, under:

- ``step-major``: every trajectory's step 1, then every step 2, ... (a flat list of steps), each request
  on any server (as a balancer without affinity spreads them: drawn at random, seeded);
- ``per-trajectory``: what the probes do (probes/entropy/, probes/removal/): ``--concurrency``
  trajectories in flight, each sending its steps back to back, each kept on one server
  (agent/backends/spread.py); also shown unpinned, to isolate the pinning.

It reports the share of prompt tokens served from cache, and that share as a percentage of the ideal (an
unbounded cache on one server: every prefix ever seen stays). That is token-level reuse, the bound for a
pure-attention model. Qwen3.5 is hybrid (Gated DeltaNet linear attention between full-attention layers): SGLang
reuses a prefix only up to a stored linear-attention state, and a request's prefill stores one state, on the
64-token checkpoint grid of its extend or at the branch point its match found (:meth:`RadixLRU.hybrid_match`, with
SGLang's files); a match stops one token short of the prompt and, for a teacher-forced scoring request, at its
``logprob_start_len``. The states sit in their own pool (``--state-slots``, as the launcher's dry run prints it),
each request in flight holding 3 slots, the tree's states evicted least recently used first. The report adds the
probes' order under that model, said as such; its reused prefixes equal SGLang's own UnifiedRadixCache's on the
probes' request sequences, with an unbounded and a small state pool (tests/conformance/test_sglang_cache.py).
``--observed`` sets a probe's recorded ``cached_tokens`` beside the model's prediction, request by request
(:func:`calibration`). Ours, and a model of the server, not the server: the cache is prompt-only (generated tokens,
and the decode-time states a regenerate output leaves every 256 tokens, also enter SGLang's tree but are never a
later prompt's prefix here, because the regenerated text differs from the recorded one; they do take room, so a
real cache fills sooner), a prompt is one extend (a prompt past SGLang's prefill chunk stores a state per chunk:
more states, the same reuse within a trajectory), one request is in flight per trajectory and requests complete in
the order they are sent (round-robin over the trajectories in flight), and an image's token count is Qwen's
28-pixel grid of its stored size (the processor may resize; counts, not sharing, change).

``--gpu-cost`` adds the prefill GPU-seconds of the uncached tokens per Figure 2 panel and backbone
(:func:`gpu_cost`), token-level bound beside the hybrid cache: an estimate from a FLOPs model (2 x active
parameters per prompt token, attention's own FLOPs left out), at ``--gpu-tflops`` (the paper's H20, §4) and
``--mfu``; ``--prefill-rate SIZE=TOKENS_PER_GPU_SECOND`` replaces it with a rate measured on the node.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from agent.lazy import lazy_exports

__all__ = ['report', 'RadixLRU', 'calibration', 'gpu_cost', 'main', 'prefix_keys', 'probe_requests', 'probe_streams', 'simulate']

# loaded when first read: ``python -m probes.prefix_cache --help`` imports this package and needs none of the work
__getattr__, __dir__ = lazy_exports(__name__, {
    "report": ".model",
    "RadixLRU": ".model",
    "prefix_keys": ".model",
    "simulate": ".model",
    "probe_streams": ".model",
    "probe_requests": ".model",
    "gpu_cost": ".model",
    "calibration": ".model",
    "main": ".cli"})

if TYPE_CHECKING:
    from .cli import main
    from .model import RadixLRU, calibration, gpu_cost, prefix_keys, probe_requests, probe_streams, report, simulate
