"""probes/prefix_cache/: the radix-cache model against a brute-force one, and the request orders it compares."""
from __future__ import annotations

import numpy as np

from probes.prefix_cache import RadixLRU, gpu_cost, main, prefix_keys, simulate
from serving.plan import ACTIVE_PARAMS


class Naive:
    """Every cached prefix as a tuple with its last access time; evict the least recently used leaf (deepest
    first among equals), never the request being served."""

    def __init__(self, capacity):
        self.capacity, self.t, self.seen = capacity, 0, {}

    def access(self, tokens):
        tokens = tuple(tokens)
        # the last token is always computed (SGLang: the match is at most the input length - 1)
        m = max((n for n in range(len(tokens)) if n == 0 or tokens[:n] in self.seen), default=0)
        self.t += 1
        for n in range(1, len(tokens) + 1):
            self.seen[tokens[:n]] = self.t
        while len(self.seen) > self.capacity:
            leaves = [p for p in self.seen if self.seen[p] != self.t
                      and not any(len(q) == len(p) + 1 and q[:-1] == p for q in self.seen)]
            if not leaves:
                break
            del self.seen[min(leaves, key=lambda p: (self.seen[p], -len(p)))]
        return m


def _trajectories(n: int, steps: int, grow: int, seed: int = 1, first: int = 200) -> list[list[np.ndarray]]:
    """``n`` probe-like streams: each step's prompt extends the previous one by ``grow`` tokens (a trajectory)."""
    rng = np.random.default_rng(seed)
    streams = []
    for _ in range(n):
        s = [rng.integers(0, 1000, first)]
        for _ in range(steps - 1):
            s.append(np.concatenate([s[-1], rng.integers(0, 1000, grow)]))
        streams.append(s)
    return streams


def test_the_radix_cache_matches_a_brute_force_one():
    rng = np.random.default_rng(1)
    for capacity in (5, 12, 40):
        fast, slow = RadixLRU(capacity), Naive(capacity)
        prefixes = [list(rng.integers(0, 4, 3))]
        for _ in range(150):  # prompts that extend, branch from and repeat earlier ones
            base = prefixes[int(rng.integers(len(prefixes)))]
            req = base[: int(rng.integers(0, len(base) + 1))] + list(rng.integers(0, 4, int(rng.integers(1, 5))))
            prefixes.append(req)
            assert fast.access(prefix_keys(np.array(req))) == slow.access(req)
            assert fast.size == len(slow.seen) <= max(capacity, len(req))


def test_keys_identify_prefixes():
    a, b = prefix_keys(np.array([5, 6, 7, 8])), prefix_keys(np.array([5, 6, 9]))
    assert a[0] == b[0] and a[1] == b[1] and a[2] != b[2] and len(set(a.tolist())) == 4
    assert prefix_keys(np.array([1, 2, 3, 4]), page=2).tolist() == prefix_keys(np.array([1, 2, 3, 4])).tolist()[1::2]


def test_the_probes_order_beats_step_major_and_pinning_beats_a_balancer():
    """Trajectories whose steps extend one another: sent per trajectory and kept on one server, a small cache
    serves nearly all it ideally could; step-major order, or a server per request, loses most of it."""
    rng = np.random.default_rng(0)
    streams = []
    for t in range(40):
        prefix = list(rng.integers(10, 10_000, 200))
        reqs = []
        for _ in range(5):
            prefix = prefix + list(rng.integers(10, 10_000, 150))
            reqs.append(np.array(prefix))
        streams.append(reqs)
    ideal = simulate(streams, capacity=None)
    cap = 8 * 1000  # room for ~8 trajectories' prompts per server
    kw = dict(capacity=cap, concurrency=8)
    step = simulate(streams, how="step-major", servers=1, **kw)
    ours = simulate(streams, how="per-trajectory", servers=1, **kw)
    assert ours["cached_tokens"] >= 0.9 * ideal["cached_tokens"] > step["cached_tokens"] * 2
    pinned = simulate(streams, servers=2, pinned=True, **{**kw, "concurrency": 16})
    loose = simulate(streams, servers=2, pinned=False, **{**kw, "concurrency": 16})
    assert pinned["cached_tokens"] >= 0.9 * ideal["cached_tokens"] > loose["cached_tokens"]
    assert ideal["prompt_tokens"] == step["prompt_tokens"] == sum(len(r) for s in streams for r in s)


def test_the_command_on_a_scripted_run(tmp_path, capsys):
    from agent.run import main as run_main

    assert run_main(["--method", "react", "--backend", "scripted", "--benchmark", "demo", "--trials", "3",
                     "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    capsys.readouterr()
    assert main([str(tmp_path / "r"), "--capacity-tokens", "4000", "--concurrency", "4"]) == 0
    out = capsys.readouterr().out
    assert "18 trajectories" in out and "per-trajectory (pinned)" in out and "servers 2" in out and "of ideal" in out
    assert "per-trajectory (pinned), hybrid cache, state grid 64" in out  # SGLang's checkpoint grid
    assert main([str(tmp_path / "r"), "--concurrency", "4", "--state-slots", "40"]) == 0
    assert "hybrid cache, state grid 64, 40 state slots" in capsys.readouterr().out
    assert main([str(tmp_path / "r"), "--mode", "teacher-forced", "--servers", "1"]) == 0
    assert main([str(tmp_path / "nope")]) == 2
    # GPU-seconds per Figure 2 panel and backbone; a measured rate replaces the FLOPs model for its backbone
    assert main([str(tmp_path / "r"), "--gpu-cost", "--prefill-rate", "27b=1000"]) == 0
    out = capsys.readouterr().out
    assert "2(b) entropy" in out and "2(c) removal" in out and "27b (measured)" in out and "9b (FLOPs)" in out
    for bad in (["--prefill-rate", "70b=5"], ["--prefill-rate", "9b=fast"], ["--mfu", "0"],
                ["--state-grid", "0"]):
        try:
            main([str(tmp_path / "r"), "--gpu-cost", *bad])
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(bad)
    assert "--prefill-rate" in capsys.readouterr().err


def test_gpu_cost_prices_the_uncached_tokens_of_each_panel():
    """Seconds = uncached prompt tokens / rate; the hybrid cache pays at least the token-level bound; Figure
    2(c)'s opening requests are the first five of each stream."""
    streams = _trajectories(6, 8, 70)
    rows = gpu_cost(streams, capacity=10**6, servers=2, concurrency=4, state_interval=64, rates={"9b": 100.0, "27b": 50.0})
    by = {(r["panel"].split()[0], r["backbone"]): r for r in rows}
    total = sum(len(r) for s in streams for r in s)
    opening = sum(len(r) for s in streams for r in s[:5])
    assert by[("2(b)", "9b")]["no_cache_s"] == total / 100 and by[("2(c)", "27b")]["no_cache_s"] == opening / 50
    tok = simulate(streams, capacity=10**6, servers=2, concurrency=8)
    assert by[("2(b)", "9b")]["token_level_s"] == (total - tok["cached_tokens"]) / 100
    for r in rows:
        assert 0 < r["token_level_s"] < r["hybrid_s"] < r["no_cache_s"]
    assert by[("2(b)", "27b")]["hybrid_s"] == 2 * by[("2(b)", "9b")]["hybrid_s"]
    assert set(ACTIVE_PARAMS) == {"9b", "27b", "35b-a3b"} and ACTIVE_PARAMS["35b-a3b"] < ACTIVE_PARAMS["9b"]


def test_the_hybrid_cache_reuses_a_prefix_only_up_to_a_stored_state():
    """SGLang's Mamba radix cache under extra_buffer: a prefill stores one linear-attention state, at the grid's last
    multiple of its extend counted from its reused prefix, or at the branch point its match found; a later request
    reuses the longest cached prefix that ends at a stored state."""
    t = 4
    first = np.arange(10)                                # prompt of 10: state stored at 8
    second = np.concatenate([first, np.arange(100, 107)])  # extends it to 17: reuses 8 (not 10), stores 16
    third = np.concatenate([second, np.arange(200, 203)])  # 20: reuses 16
    other = np.concatenate([np.arange(6), np.arange(300, 310)])  # shares 6 tokens: no state below 8 -> 0;
    # its KV hit reaches the grid point 4: the branch point, where it stores its state instead of at 16
    again = np.concatenate([np.arange(6), np.arange(400, 410)])  # shares 6 again: reuses the branch state at 4
    hybrid, token = RadixLRU(None, t), RadixLRU(None)
    got = [(hybrid.access(prefix_keys(x)), token.access(prefix_keys(x))) for x in (first, second, third, other, again)]
    assert got == [(0, 0), (8, 10), (16, 17), (0, 6), (4, 6)]
    # a short prompt stores no state; the same prompt twice reuses up to its own state only
    c = RadixLRU(None, 8)
    assert [c.access(prefix_keys(np.arange(5))), c.access(prefix_keys(np.arange(5)))] == [0, 0]
    assert [c.access(prefix_keys(np.arange(20))), c.access(prefix_keys(np.arange(20)))] == [0, 16]
    # never more than token-level reuse, on a probe-like stream
    streams = _trajectories(20, 5, 90, seed=0, first=300)
    tok = simulate(streams, capacity=None, concurrency=4)
    hyb = simulate(streams, capacity=None, concurrency=4, state_interval=64)
    assert 0 < hyb["cached_tokens"] < tok["cached_tokens"]


def test_a_state_pool_too_small_for_the_trajectories_in_flight_evicts_their_states():
    """Each running request holds 3 state slots and SGLang runs at most slots / 5 requests at once (the rest wait,
    holding none); the tree keeps what is left, least recently used evicted first. A trajectory in flight keeps two
    states recent (the one its step reused, refreshed by the match, and the one it tracked): with room for two per
    trajectory the probes' order loses nothing; with less, a trajectory's state is gone before its next step and
    the reuse drops."""
    assert RadixLRU(None, 64, 40, running=8).state_room == 40 - 3 * 8  # 8 run: the cap is 40 / 5
    assert RadixLRU(None, 64, 24, running=8).state_room == 24 - 3 * 4  # 4 run, 4 wait in SGLang's queue
    streams = _trajectories(16, 6, 130)
    kw = dict(capacity=None, servers=1, concurrency=8, state_interval=64)
    free = simulate(streams, **kw)["cached_tokens"]
    assert simulate(streams, **kw, state_slots=8 * 5)["cached_tokens"] == free  # two each
    less = simulate(streams, **kw, state_slots=24)["cached_tokens"]  # 12 for the 8 trajectories' states
    assert 0 < less < free
    assert simulate(streams, **kw, state_slots=15)["cached_tokens"] < less  # 3 run: 6 for 8 trajectories


def test_the_servers_cached_tokens_beside_the_models_prediction(tmp_path, tiny_model_dir, capsys):
    """--observed: an entropy probe's regenerate rows carry the server's prompt_tokens and cached_tokens; the
    command sets them beside the model's prediction for the same requests (issue 58: the first GPU run calibrates
    the model in one step). The loopback server here caches as an unbounded token-level cache would."""
    import json

    from probes.entropy import main as entropy_main
    from serving.fakes.sglang_server import FakeSGLang
    from tests.records import record_react_run

    run = tmp_path / "r"
    record_react_run(run, tiny_model_dir, limit=3)
    assert main([str(run), "--observed"]) == 2  # no probe yet: says which command makes one
    assert "run python -m probes.entropy" in capsys.readouterr().err
    with FakeSGLang(tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir)) as srv:
        srv.prompts = []
        assert entropy_main([str(run), "--mode", "regenerate", "--backend", "sglang", "--endpoint", srv.url,
                             "--model-dir", str(tiny_model_dir), "--skip-fidelity", "--force", "--concurrency", "1",
                             "--include-unparsed", "--no-progress"]) == 0
    capsys.readouterr()
    assert main([str(run), "--observed", "--servers", "1", "--concurrency", "1", "--model-dir", str(tiny_model_dir)]) == 0
    out = capsys.readouterr().out
    cal = json.loads((run / "probes" / "entropy-regenerate" / "cache_calibration.json").read_text())
    rows = [json.loads(x) for x in (run / "probes" / "entropy-regenerate" / "steps.jsonl").read_text().splitlines()]
    assert cal["requests"] == len(rows) > 1 and f"{cal['requests']} regenerate requests" in out
    assert sum(p["cached_tokens"] for p in cal["per_request"]) == sum(r["cached_tokens"] for r in rows) > 0
    assert 0 < cal["observed_share"] < 1 and 0 < cal["predicted_token_level_share"] < 1
    assert cal["predicted_hybrid_share"] <= cal["predicted_token_level_share"]  # states only on the grid
    for p in cal["per_request"]:
        assert p["predicted_cached_token_level"] < p["predicted_prompt_tokens"] and p["cached_tokens"] < p["prompt_tokens"]
    # the loopback server expands an image to 4 tokens, our rendering to its real grid: counted, not hidden
    assert cal["prompt_tokens_differ"] == sum(p["prompt_tokens"] != p["predicted_prompt_tokens"] for p in cal["per_request"])


def test_a_scoring_requests_match_stops_at_its_logprob_start_len():
    """SGLang caps a scoring request's match at its logprob_start_len (the scored continuation is always computed):
    the same tokens scored twice reuse only the prompt before the continuation."""
    seq = prefix_keys(np.arange(1, 201))
    for interval in (None, 64):
        c = RadixLRU(None, interval)
        c.access(seq, cap=149)
        assert c.access(seq) == (199 if interval is None else 192)  # uncapped: all but the last token
        c = RadixLRU(None, interval)
        c.access(seq, cap=149)
        # hybrid: the only state is at 192, past the cap: nothing reusable (the prefill then stores one at 128)
        assert c.access(seq, cap=149) == (149 if interval is None else 0)
