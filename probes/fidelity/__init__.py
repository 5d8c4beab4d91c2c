"""Is the server fit to be probed? Score recorded continuations several ways and compare (ours; issue 25).

    python -m probes.fidelity RUN_DIR [--backend sglang --endpoint URL --model-dir DIR] [--samples 8]
        [--reference-model-dir DIR] [--force] [--out DIR]

A probe compares log-probabilities of one model under two contexts. If the server's log-probabilities of the
*same* tokens in the *same* context differ between requests — a prefix-cache state leaking from one request
into the next (a cached image state reused for another image), the cached and the uncached path disagreeing,
the server and the reference implementation disagreeing once an image is in the prompt (users report up to
0.3 nat) — a ΔH drawn from it is noise. On a sample of the run's image-bearing calls (one per trajectory, in
order) this scores the recorded continuation with its images:

- **warm**: twice in a row (the second request finds the first's prefix in the cache);
- **cold**: once more after ``/flush_cache`` (SGLang's endpoint; the path without the cache);
- **local**: with the in-process transformers model when the weights are local (``--reference-model-dir``; a
  GPU node has them), against the first scoring;
- **paths**: SGLang serves the same model on its native ``/generate`` (our client renders the chat template) and
  on ``/v1/chat/completions`` (the server renders it and decodes the images). A chat-path request cannot be
  teacher-forced, so both generate greedily (temperature 0, ``PATH_TOKENS`` tokens, top-20) from the recorded
  messages; the prompt token counts must be equal (the same rendered prompt, images expanded alike) and the
  logprobs agree over the tokens both chose (the greedy prefix they share; a first token that differs fails).
  Tokens are compared by id where the chat reply carries SGLang's ``meta_info``, by text where it does not
  (a proxy in front that drops it passes only the OpenAI ``logprobs``, tokens and alternatives as texts; smg
  passes it).
  Run on every SGLang native backend unless ``--no-paths``; a probe run on one path and a figure drawn from
  the other then rest on the same context.
- **mode**: which logprobs the server returns for what it generates, raw (log_softmax(z), under
  ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``) or scaled (log_softmax(z / T), SGLang's default): an environment variable
  that ``/server_info`` does not show. The server generates ``PATH_TOKENS`` tokens at the run's temperature,
  then scores them teacher-forced (always raw: SGLang's prefill logprobs take no temperature). A raw teacher-forced
  logprob l with its top-20 predicts the scaled one as l / T − logsumexp(top-20 / T) (the tail beyond the 20th
  weighs exp(−Δ/T), nothing at T = 0.2); each generated logprob is read against both predictions, over the
  tokens where they lie ``MODE_SEPARATION`` apart. The verdict must be the run header's ``backend.logprob_mode``,
  or the run's entropies mean something other than their label. Undecided (not a failure) at T = 0 or 1, or
  when no token separates the two.

On **vLLM** (``--backend vllm``): **warm** scores each sampled call's recorded continuation with its images
twice (vLLM's token-in route with the images, agent/backends/vllm.py); **cold** and **paths** are SGLang's
(skipped); **local** as above (``--reference-model-dir``: the engine against in-process transformers); **mode** runs on
the call's text, scored by token ids over ``/v1/completions`` (ours: no re-tokenisation can blur it): the server
generates ``PATH_TOKENS`` tokens at the run's temperature, scores them (also a warm pair), and its output logprobs
must read as raw (vLLM's default ``--logprobs-mode raw_logprobs``, which a run through vLLM records; a server started
with ``processed_logprobs`` reads as scaled or neither, and fails).

Per check: the largest and the mean |Δ logprob| of the scored tokens and the mean / smallest top-20 overlap
(shared ids / 20). Refused (exit 2) beyond the tolerances below unless ``--force`` (recorded); the report is
written as ``fidelity.json`` (default: ``RUN_DIR/probes/fidelity/``). ``python -m probes.entropy`` runs it first
on a serving backend unless ``--skip-fidelity`` (recorded in its probe.json).

Tolerances (ours): bf16 inference repeats a prefill to within a few hundredths of a nat per token (batch
composition changes the reduction order), while the paper's effects are ΔH of ~0.1-0.5 nats per step mean
over hundreds of think tokens. Repeats of one request on one server (warm, cold) must agree to a mean of
0.02 nat (max 0.25 on any token) with ≥ 0.95 top-20 overlap; the server against the reference implementation
(different kernels, bf16 vs the reference's dtype) to a mean of 0.05 nat with ≥ 0.90 overlap. A cache leak of
the reported size (0.3 nat) fails every one of them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from agent.lazy import lazy_exports

__all__ = ['MODE_SEPARATION', 'MODE_TOLERANCE', 'PATH_TOKENS', 'TOLERANCES', 'chat_twin', 'check_servers', 'fidelity_check', 'main', 'mode_readings', 'mode_verdict', 'refusal']

# loaded when first read: ``python -m probes.fidelity --help`` imports this package and needs none of the work
__getattr__, __dir__ = lazy_exports(__name__, {
    "fidelity_check": ".checks",
    "check_servers": ".checks",
    "chat_twin": ".checks",
    "refusal": ".checks",
    "mode_readings": ".checks",
    "mode_verdict": ".checks",
    "TOLERANCES": ".checks",
    "PATH_TOKENS": ".checks",
    "MODE_TOLERANCE": ".checks",
    "MODE_SEPARATION": ".checks",
    "main": ".cli"})

if TYPE_CHECKING:
    from .checks import (
        MODE_SEPARATION,
        MODE_TOLERANCE,
        PATH_TOKENS,
        TOLERANCES,
        chat_twin,
        check_servers,
        fidelity_check,
        mode_readings,
        mode_verdict,
        refusal,
    )
    from .cli import main
