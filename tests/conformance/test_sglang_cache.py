"""probes/prefix_cache/'s hybrid cache model against SGLang 0.5.23's own UnifiedRadixCache with its Mamba
component, run on CPU by SGLang's test kit (tests/conformance/sglang_oracle.py ``hybrid_cache``): the reused prefix
of every prompt, token for token, on the probes' own request sequences and on branching families (issue 58).

What runs as SGLang's code: the radix tree, the Mamba component's match (which stored states a prompt can reuse,
the branch point), and what a finished request donates. What is our reading in both: where a prefill tracks its one
state (the scheduler's ``_mamba_radix_cache_v2_req_prepare_for_extend`` needs a model runner to run), and the match
cap (``_compute_max_prefix_len``: the last token, a scoring request's ``logprob_start_len``). The state pool's
eviction runs as SGLang's code too (``evict_for_alloc`` at a small ``mamba_cache_size``), one request running at a
time. Not covered: decode-time states (a generation's tracked states past its prompt), prefill chunks, the locks of
other requests in flight, and KV eviction (the KV pool here is unbounded)."""
from __future__ import annotations

import numpy as np
import pytest

from probes.prefix_cache import RadixLRU, prefix_keys, probe_requests
from serving.plan import STATE_GRID

pytestmark = pytest.mark.slow  # seconds of set-up each on a busy 2-core machine: the full suite runs it, the quick loop not


def _ours(prompts: list[list[int]], caps=None, slots=None) -> list[int]:
    cache = RadixLRU(None, STATE_GRID, slots, running=1)
    caps = caps or [None] * len(prompts)
    return [cache.access(prefix_keys(np.asarray(p, dtype=np.int64)), c) for p, c in zip(prompts, caps)]


def _theirs(sglang, prompts: list[list[int]], caps=None, slots=None) -> list[int]:
    ans = sglang.ask("hybrid_cache", prompts=prompts, grid=STATE_GRID, caps=caps, state_slots=slots)
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


def test_the_state_pools_lru_evicts_what_sglangs_evicts(sglang):
    """Small pools (4-8 slots, 3 of them the running request's): inner states tombstoned, leaves evicted with
    their node's KV; across 16 families every reused prefix equal, and the small pools do cost reuse."""
    lost = 0
    for seed in range(16):
        prompts = _families(seed)
        unbounded = _ours(prompts)
        for slots in (8, 6, 5, 4):
            ours = _ours(prompts, slots=slots)
            assert ours == _theirs(sglang, prompts, slots=slots), (seed, slots)
            lost += sum(unbounded) - sum(ours)
    assert lost > 0  # the pool's eviction was exercised, not only its bookkeeping


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
        assert _ours(prompts, flat_caps, 5) == _theirs(sglang, prompts, flat_caps, 5), mode


def test_the_state_slots_a_request_holds_and_those_sglang_reserves_for_it_are_sglangs(sglang):
    """SGLang 0.5.23 under the launcher's ``--mamba-radix-cache-strategy extra_buffer`` (overlap schedule on): each
    running request holds 3 state slots (its working state and two ping-pong track buffers: what the cache model
    charges), while the scheduler caps ``max_running_requests`` at the pool's slots / 5 (SGLang PR #27220's 5: the
    3 held and 2 kept for the tree), which serving/plan.py prints as the server's cap."""
    from serving.plan import ADMITTED_SLOTS_PER_REQUEST, SLOTS_PER_REQUEST

    ans = sglang.ask("mamba_slots", strategy="extra_buffer", overlap=True)
    assert ans["ok"], ans
    assert (ans["held"], ans["admitted"]) == (SLOTS_PER_REQUEST, ADMITTED_SLOTS_PER_REQUEST) == (3, 5)
    # the same rule moves with the strategy, so the constants are SGLang's, not a coincidence of one setting
    plain = sglang.ask("mamba_slots", strategy="no_buffer", overlap=True)
    assert plain["ok"] and (plain["held"], plain["admitted"]) == (1, 3), plain
