"""A model's identity and its server's facts, compared: which runs were made by one model computing one way.

    local_identity(model_dir)                  an in-process model's identity (a fingerprint of config + weights)
    same_model(recorded, current)              None, or how two identities name different models
    server_differences(recorded, current)      None, or how two servers differ in what changes the numbers
    unverified_facts(recorded, current)        None, or why two servers cannot be compared at all

Pure (no request): the run directory's resume check, merge and the tables' pooling use it, below everything that
asks a server (agent/preflight/ asks; this module compares).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["local_identity", "same_model", "server_differences", "unverified_facts", "deterministic_cost",
           "SERVER_FACTS", "NUMBER_FACTS"]


#: What an SGLang server's information endpoint says about how it computes (SGLang 0.5.23 server-argument names):
#: recorded in every header (``model.server``) so that a figure can be traced to the configuration behind it.
SERVER_FACTS = ("version", "model_path", "served_model_name", "dtype", "quantization", "kv_cache_dtype",
                "context_length", "tp_size", "attention_backend", "disable_radix_cache", "chunked_prefill_size",
                "enable_deterministic_inference", "sampling_defaults", "mamba_radix_cache_strategy",
                "mamba_track_interval", "mamba_max_states_per_path", "mem_fraction_static", "reasoning_parser",
                "mamba_ssm_dtype", "linear_attn_backend", "launch_command")
#: Of those, what changes the numbers themselves (ours): runs whose servers differ here are never pooled. The SSM
#: state's dtype (float32 vs bf16 recurrent states) moves the linear-attention layers' outputs; ``tp_size`` and the
#: attention / linear-attention backends move logprobs by ~1e-3 (a different reduction order), far below the
#: effects the tables and probes measure, so they are recorded, not refused (docs/serving.md).
NUMBER_FACTS = ("model_path", "dtype", "quantization", "kv_cache_dtype", "mamba_ssm_dtype",
                "enable_deterministic_inference")


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
