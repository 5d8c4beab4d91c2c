"""What may be pooled into one table row, and the notes that say what differs between the runs of a table.

- runs of the paper's protocol and the release's (``--protocol release``) are never one row;
- runs of one model from servers that compute differently (dtype, quantization, deterministic mode…) are never
  pooled;
- header fields that change numbers are named when compared runs differ (flagged, not refused);
- n counts each manifest id once (ours), against the rows the release runs: the release iterates every manifest row, duplicates included (``pipelines/base_pipeline.py:103-116``): its
collection counts 1,727 rows (MMSearch 171, two of them repeating an earlier id). We read a repeated id once
(``agent.benchmarks``), so the same manifests give n = 1,725. Table 1 prints both counts in a footnote.
"""
from __future__ import annotations

import json

from agent.identity import server_differences
from agent.record import RunHeader
from agent.rundir import RunError

__all__ = ["duplicates_note", "comparability_note", "refuse_mixed_protocols", "refuse_mixed_servers", "serving_engine", "COMPARED"]

#: Header fields that must agree for numbers to be compared side by side (flagged, not refused).
COMPARED = ("budgets", "sampling", "history_reasoning", "observation_images", "protocol")


def serving_engine(header: RunHeader) -> str | None:
    """The engine that computed a run's numbers: sglang, vllm, transformers (the local backend), scripted; None for
    a chat API whose server the run did not name."""
    kind, server = header.backend.kind, header.backend.server
    if kind in ("sglang", "vllm"):
        return kind
    if kind == "local":
        return "transformers"
    if kind == "scripted":
        return "scripted"
    return server if kind == "openai" and server in ("sglang", "vllm") else None


def refuse_mixed_servers(what: str, runs) -> None:
    """Runs of one model pooled together (a table row, a figure's model) must come from servers that compute alike:
    the same engine (SGLang and vLLM run other kernels, batch and cache differently; ours), the same weights, dtype,
    quantization, KV-cache dtype, SSM-state dtype and deterministic mode (``agent.identity.NUMBER_FACTS``), and the
    same logprob mode (the run header's ``backend.logprob_mode``)."""
    for r in runs[1:]:
        engines = [serving_engine(x.header) for x in (runs[0], r)]
        if None not in engines and engines[0] != engines[1]:
            raise RunError(f"{what}: {runs[0].path} and {r.path} cannot be pooled: served by different engines "
                           f"({engines[0]} vs {engines[1]}); one pooled row, one engine")
        why = server_differences(*[x.header.model.as_recorded() if x.header.model else None for x in (runs[0], r)])
        modes = [x.header.backend.logprob_mode for x in (runs[0], r)]
        if not why and None not in modes and modes[0] != modes[1]:
            why = f"their logprob modes differ ({modes[0]} vs {modes[1]}: raw and scaled logprobs differ at T != 1)"
        if why:
            raise RunError(f"{what}: {runs[0].path} and {r.path} cannot be pooled: {why}")


def refuse_mixed_protocols(key, runs) -> None:
    """One table row pools runs of one protocol only (a header without one predates it: the paper's)."""
    protocols = {r.header.protocol for r in runs}
    if len(protocols) > 1:
        raise RunError(f"{key[0]} on {key[1]}: runs of different protocols ({', '.join(sorted(protocols))}) in one "
                       f"row ({', '.join(str(r.path) for r in runs)}); each protocol is its own method")




def duplicates_note(runs) -> str:
    """The footnote for the runs' benchmarks whose manifest repeats ids ("" when none does)."""
    per: dict[str, tuple[int, int]] = {}
    for run in runs:
        h = run.header
        dups = h.manifest_problems.get("duplicate_id", 0)
        if h.benchmark and h.n_samples is not None:
            per[h.benchmark] = (h.n_samples, dups)
    if not any(d for _, d in per.values()):
        return ""
    named = "; ".join(f"{b}: {n + d} rows, {d} repeating an earlier id, n = {n}" for b, (n, d) in sorted(per.items()) if d)
    n_all, rows_all = sum(n for n, _ in per.values()), sum(n + d for n, d in per.values())
    return (f"**n counts each manifest id once** (ours; the release runs every row, pipelines/base_pipeline.py:103-116): "
            f"{named}. Over these benchmarks: n = {n_all:,} here, {rows_all:,} rows as the release counts them.")


def comparability_note(runs) -> str:
    seen: dict = {}
    for run in runs:
        for k in COMPARED:
            v = getattr(run.header, k)
            v = v.as_recorded() if hasattr(v, "as_recorded") else v
            if k == "sampling" and isinstance(v, dict):  # each run draws its own seed (per-trial seeds): not a difference
                v = {a: b for a, b in v.items() if a != "seed"}
            seen.setdefault(k, {}).setdefault(json.dumps(v, sort_keys=True), []).append(run.path.name)
    diffs = []
    for k, vals in seen.items():
        if len(vals) > 1:
            alts = " vs ".join(f"{v}: {', '.join(names)}" for v, names in vals.items())
            diffs.append(f"{k} differs ({alts})")
    return ("**Warning: compared runs differ:** " + "; ".join(diffs) + ".") if diffs else ""
