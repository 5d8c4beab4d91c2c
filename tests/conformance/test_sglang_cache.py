"""probes/prefix_cache.py's hybrid cache model against SGLang 0.5.23's own UnifiedRadixCache with its Mamba
component, run on CPU by SGLang's test kit (tests/conformance/sglang_oracle.py ``hybrid_cache``): the reused prefix
of every prompt, token for token, on the probes' own request sequences and on branching families (issue 58).

What runs as SGLang's code: the radix tree, the Mamba component's match (which stored states a prompt can reuse,
the branch point), and what a finished request donates. What is our reading in both: where a prefill tracks its one
state (the scheduler's ``_mamba_radix_cache_v2_req_prepare_for_extend`` needs a model runner to run), and the match
cap (``_compute_max_prefix_len``: the last token, a scoring request's ``logprob_start_len``). Not covered:
decode-time states (a generation's tracked states past its prompt), prefill chunks, and eviction (the tree here is
unbounded)."""
from __future__ import annotations

import numpy as np
import pytest

from probes.prefix_cache import STATE_GRID, RadixLRU, prefix_keys, probe_requests


def _ours(prompts: list[list[int]], caps=None) -> list[int]:
    cache = RadixLRU(None, STATE_GRID)
    caps = caps or [None] * len(prompts)
    return [cache.access(prefix_keys(np.asarray(p, dtype=np.int64)), c) for p, c in zip(prompts, caps)]


def _theirs(sglang, prompts: list[list[int]], caps=None) -> list[int]:
    ans = sglang.ask("hybrid_cache", prompts=prompts, grid=STATE_GRID, caps=caps)
    assert ans["ok"], ans
    return [r["reused"] for r in ans["requests"]]


def _families(seed: int) -> list[list[int]]:
    """Trajectory-like prompts: each extends the last by a history increment, some branch off mid-way."""
    rng = np.random.default_rng(seed)
    out, base = [], list(rng.integers(1, 50_000, 40))
    for _ in range(12):
        if out and rng.random() < 0.3:  # a branch: an earlier prompt cut somewhere, then new tokens
            src = out[int(rng.integers(len(out)))]
            cut = int(rng.integers(1, len(src)))
            p = src[:cut] + list(rng.integers(1, 50_000, int(rng.integers(1, 200))))
        else:
            p = base = base + list(rng.integers(1, 50_000, int(rng.integers(1, 300))))
        out.append([int(x) for x in p])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_hybrid_model_reuses_what_sglangs_cache_reuses_on_branching_families(sglang, seed):
    prompts = _families(seed)
    assert _ours(prompts) == _theirs(sglang, prompts)


def test_the_hybrid_model_reuses_what_sglangs_cache_reuses_on_the_probes_requests(sglang, tmp_path):
    from agent.run import main as run_main

    assert run_main(["--method", "react", "--backend", "scripted", "--benchmark", "demo", "--out", str(tmp_path / "r"),
                     "--no-progress"]) == 0
    for mode in ("teacher-forced", "regenerate"):
        streams, _, caps = probe_requests(tmp_path / "r", mode=mode)
        prompts = [[int(x) for x in r] for s in streams for r in s]  # the probes' order: trajectory by trajectory
        flat_caps = [c for cs in caps for c in cs]  # teacher-forced: each scoring request's logprob_start_len
        assert len(prompts) > 5 and (mode == "regenerate") == all(c is None for c in flat_caps)
        assert _ours(prompts, flat_caps) == _theirs(sglang, prompts, flat_caps), mode
