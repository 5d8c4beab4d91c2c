"""The entropy probe recovers a planted ΔH (both modes), resumes, refuses mixed semantics; KL and stats."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from agent.backends.base import LogprobSemantics
from agent.backends.scripted import ScriptedBackend
from agent.run import RunConfig, run
from agent.rundir import RunError, frames
from agent.rundir.lines import line_digest, seal
from agent.rundir.probe_outputs import write_outputs
from analysis.estimators.influence import kl_union_tail
from analysis.estimators.stats import bootstrap_ci, mcnemar_p, wilcoxon_p
from probes.entropy import main as entropy_main
from probes.entropy import probe_run
from probes.entropy.command import draw_panels


def policy(messages):
    n = sum(m["role"] == "assistant" for m in messages)
    if n < 2:
        return ('<think>\nlook at it\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": "q' + str(n)
                + '", "goal": "g"}}\n</tool_call>')
    return "<think>\nso the answer\n</think>\n\n<answer>x</answer>"


def planted(has_images: bool, pos: int):
    """With images: 10 tokens at 0.08 + tail 0.2; without: 5 at 0.16 + tail 0.2."""
    return [math.log(0.08)] * 10 if has_images else [math.log(0.16)] * 5


H_WITH = -10 * 0.08 * math.log(0.08) - 0.2 * math.log(0.2)
H_WITHOUT = -5 * 0.16 * math.log(0.16) - 0.2 * math.log(0.2)


async def _run(tmp_path, **kw):
    backend = ScriptedBackend([policy] * 500, top_fn=planted)
    await run(RunConfig(method="react", out=str(tmp_path / "run"), limit=3, progress=False, **kw), [], backends=[backend])
    return backend


@pytest.mark.parametrize("mode", ["regenerate", "teacher-forced"])
async def test_probe_recovers_planted_delta_h(tmp_path, mode):
    backend = await _run(tmp_path)
    n_before = len(backend.calls)
    res = await probe_run(tmp_path / "run", mode=mode, backend=backend, progress=False)
    steps, summary = res["steps"], res["summary"]
    assert len(steps) == 9 and set(steps.step) == {1, 2, 3}  # 3 trajectories x 3 calls, all with the image
    assert np.allclose(steps.H_with, H_WITH) and np.allclose(steps.H_without, H_WITHOUT)
    assert np.allclose(summary["mean"], H_WITH - H_WITHOUT) and (summary["n"] == 3).all()
    new = backend.calls[n_before:]
    if mode == "regenerate":
        assert len(new) == 9 and all(c["kind"] == "generate" and not c["has_images"] for c in new)
    else:  # both sides scored, the recorded tokens, with and without the image
        assert [c["has_images"] for c in new] == [True, False] * 9 and all(c["kind"] == "score" for c in new)
        assert (steps.kl_with_without > 0).all()
    out = res["out"]
    assert (out / "steps.parquet").exists() and (out / "summary.csv").exists()
    assert not (out / "fig2b_entropy.png").exists()  # probe_run writes tables; the command draws (its view)
    draw_panels(res)
    assert (out / "fig2b_entropy.png").exists()
    # the bounds: the grouped value is the lower one; the upper spreads the 0.2 tail evenly over V - m tokens
    V = backend.vocab
    hi_with = -10 * 0.08 * math.log(0.08) - 0.2 * math.log(0.2 / (V - 10))
    hi_without = -5 * 0.16 * math.log(0.16) - 0.2 * math.log(0.2 / (V - 5))
    assert np.allclose(steps.H_high_with, hi_with) and np.allclose(steps.H_high_without, hi_without)
    assert np.allclose(steps.dH_low, H_WITH - hi_without) and np.allclose(steps.dH_high, hi_with - H_WITHOUT)
    assert ((steps.dH_low < steps.dH) & (steps.dH < steps.dH_high)).all()
    # forking tokens: one run-wide threshold from the with-images side (every with-token is at 2.34 nats, so all
    # of them fork; the without side's 1.79 never does): ΔH = the forking part + the rest
    fork = __import__("pandas").read_csv(out / "forking.csv")
    assert (fork.share_fork_with == 1.0).all() and (fork.share_fork_without == 0.0).all()
    assert (fork.threshold_nats <= H_WITH).all() and (fork.threshold_nats > H_WITHOUT).all()
    want_fork = H_WITH - H_WITHOUT if mode == "teacher-forced" else H_WITH  # TF: the same tokens' dH
    assert np.allclose(steps.dH_fork, want_fork, atol=1e-4) and np.allclose(steps.dH_fork + steps.dH_rest, steps.dH)
    assert (out / "fig2b_forking.png").exists()
    # a 0.2 tail over 248k tokens leaves ~2.8 nats of doubt: the planted +0.55 is not robust in sign
    assert (steps.sign_robust == 0).all() and (summary.sign_robust == 0).all() and (summary.n_bounded == 3).all()
    if mode == "regenerate":  # what the server did: requests, prompt tokens, those it served from its cache, time
        serving = json.loads((out / "probe.json").read_text())["serving"]
        assert serving["requests"] == 9 and serving["prompt_tokens"] == int(steps["prompt_tokens"].sum()) > 0
        assert serving["cached_tokens"] == 0 and serving["cached_share"] == 0.0
    assert (out / "fig2b_entropy.pdf").exists()


async def test_probe_skips_steps_without_images_and_resumes(tmp_path):
    backend = await _run(tmp_path, remove_images_from_step=2)
    res = await probe_run(tmp_path / "run", backend=backend, progress=False)
    assert set(res["steps"].step) == {1}  # steps 2.. had no images in their context
    n = len(backend.calls)
    res2 = await probe_run(tmp_path / "run", backend=backend, progress=False)
    assert len(backend.calls) == n and len(res2["steps"]) == 3  # nothing probed twice


async def test_probe_resumes_after_a_torn_append(tmp_path):
    """An interrupted append leaves a fragment at the end of steps.jsonl: the rerun sets it aside (quarantine/),
    probes that step again, and every step is in the result once."""
    backend = await _run(tmp_path)
    res = await probe_run(tmp_path / "run", backend=backend, progress=False)
    path = res["out"] / "steps.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    torn = lines[-1][: len(lines[-1]) // 2]
    path.write_bytes(b"".join(lines[:-1]) + torn)
    n = len(backend.calls)
    res2 = await probe_run(tmp_path / "run", backend=backend, progress=False)
    assert len(backend.calls) == n + 1  # only the torn step again
    assert len(res2["steps"]) == 9 and not res2["steps"].duplicated(["sample_id", "trial", "step"]).any()
    assert (path.parent / "quarantine" / "steps.jsonl").read_bytes() == torn + b"\n"  # the fragment, kept aside
    assert all(line_digest(x) for x in path.read_bytes().splitlines()) and len(path.read_bytes().splitlines()) == 9


async def test_an_edited_or_foreign_row_is_set_aside_and_probed_again(tmp_path, caplog):
    """Probe rows are sealed to the line they were computed from (issue 68): a row whose ΔH was edited after it was
    written, and a row naming another line's seal, are both left out of the result, set aside into quarantine/
    with a warning naming the file, and probed again; a table whose rows name a line the run does not hold is
    refused by agent.rundir.frames."""
    backend = await _run(tmp_path)
    res = await probe_run(tmp_path / "run", backend=backend, progress=False)
    path = res["out"] / "steps.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    edited = lines[0].replace(b'"dH":', b'"dH":9', 1)  # the sed a reader must not believe
    assert edited != lines[0]
    foreign = json.loads(lines[1])
    foreign["source_sha256"] = "0" * 64  # sealed well, but computed from a line this run does not hold
    path.write_bytes(edited + seal(foreign) + b"\n" + b"".join(lines[2:]))
    n = len(backend.calls)
    res2 = await probe_run(tmp_path / "run", backend=backend, progress=False)
    assert len(backend.calls) == n + 2  # only those two steps again
    assert len(res2["steps"]) == 9 and np.allclose(res2["steps"].H_with, H_WITH)
    assert (path.parent / "quarantine" / "steps.jsonl").read_bytes() == edited
    assert any("changed since written" in r.message and str(path) in r.message for r in caplog.records)
    assert len(frames.entropy(tmp_path / "run")) == 9
    table = res2["out"] / "steps.parquet"
    df = pd.read_parquet(table)
    df.loc[0, "source_sha256"] = "0" * 64
    df.to_parquet(table, index=False)
    with pytest.raises(RunError, match="steps.parquet: changed since its probe wrote it"):  # edited: its seal
        frames.entropy(tmp_path / "run")
    write_outputs(res2["out"], {"steps.parquet": df}, rows="steps.jsonl")  # sealed from a line since replaced
    with pytest.raises(RunError, match="1 of 9 row.*python -m probes.entropy"):
        frames.entropy(tmp_path / "run")


async def test_an_interrupted_probe_keeps_every_finished_step(tmp_path, capsys):
    """Steps are kept as they finish, not per trajectory: a probe stopped in the middle of a trajectory (here an
    unexpected error at the 5th request, one trajectory at a time) keeps the 4 steps done, and the rerun probes
    the other 5 only."""
    backend = await _run(tmp_path)

    class Stops(ScriptedBackend):
        async def generate(self, messages, sampling):
            if len(self.calls) == 4:
                raise RuntimeError("stopped")  # an unexpected stop (Ctrl-C's KeyboardInterrupt takes the same path)
            return await super().generate(messages, sampling)

    stops = Stops([policy] * 50, top_fn=planted)
    with pytest.raises(RuntimeError, match="stopped"):
        await probe_run(tmp_path / "run", backend=stops, progress=False, concurrency=1)
    path = tmp_path / "run" / "probes" / "entropy-regenerate" / "steps.jsonl"
    assert len(path.read_bytes().splitlines()) == 4
    assert "4 steps finished in this session are kept" in capsys.readouterr().err
    n = len(backend.calls)
    res = await probe_run(tmp_path / "run", backend=backend, progress=False)
    assert len(backend.calls) == n + 5 and len(res["steps"]) == 9


async def test_teacher_forced_tokens_are_one_file_per_trajectory_and_survive_an_interrupt(tmp_path, capsys):
    """Per-token results go to tokens/<key>.parquet (one per trajectory, a step column); a probe stopped inside a
    trajectory leaves that trajectory's finished steps in its partial file, and the next probe folds them in:
    every step that has a row in steps.jsonl has its tokens, nothing is scored twice."""
    from probes.entropy import read_step_tokens

    backend = await _run(tmp_path)

    class Stops(ScriptedBackend):
        async def score(self, messages, continuation, **kw):
            if len(self.calls) == 8:  # the 5th step's first request: 4 steps done, the 2nd trajectory's 1st done
                raise RuntimeError("stopped")
            return await super().score(messages, continuation, **kw)

    stops = Stops([policy] * 50, top_fn=planted)
    with pytest.raises(RuntimeError, match="stopped"):
        await probe_run(tmp_path / "run", mode="teacher-forced", backend=stops, progress=False, concurrency=1)
    tokens = tmp_path / "run" / "probes" / "entropy-teacher-forced" / "tokens"
    assert len([p for p in tokens.glob("*.parquet")]) == 1 and len(list(tokens.glob("*.partial.arrows"))) == 1
    partial = next(tokens.glob("*.partial.arrows"))
    with pa.ipc.open_stream(partial.read_bytes()) as r:  # the one step finished there, one whole Arrow stream
        kept = r.read_all()
    assert kept.num_rows > 0 and kept.column("w_ids").type.list_size == 5 and b"alt_texts" in kept.schema.metadata
    n = len(backend.calls)
    res = await probe_run(tmp_path / "run", mode="teacher-forced", backend=backend, progress=False)
    assert len(backend.calls) == n + 2 * 5 and len(res["steps"]) == 9
    assert "folded the token results of an interrupted probe" in capsys.readouterr().err
    assert not list(tokens.glob("*.partial.arrows")) and len(list(tokens.glob("*.parquet"))) == 3
    for (sid, trial), g in res["steps"].groupby(["sample_id", "trial"]):
        from agent.rundir import token_key

        got = read_step_tokens(tokens, token_key(sid, trial))
        assert sorted(got) == sorted(g.step)
        for step, t in got.items():
            assert len(t["pos"]) == int(g[g.step == step].n_think.iloc[0]) > 0
            assert np.allclose(np.mean(t["kl"]), g[g.step == step].kl_with_without.iloc[0], atol=1e-6)
            # the viewer's hover: the top-5 under both contexts, best first, with their texts (through the recovery)
            assert t["w_ids"].shape == t["o_ids"].shape == (len(t["pos"]), 5)
            assert (np.diff(t["w_lp"], axis=1) <= 0).all() and all(int(i) in t["texts"] for i in t["w_ids"].ravel())


def test_token_store_steps_are_appended_whole_and_folded_in_on_recovery(tmp_path):
    """Each finished step is one whole Arrow stream appended to its trajectory's partial file (a kill mid-append
    leaves a torn last stream, never read as a step); a store that starts folds the partial files in, every array
    and text as it was, each step once (its latest tokens where a rerun appended it again)."""
    from agent.rundir import RunError
    from agent.rundir.probe_outputs import write_outputs
    from probes.entropy import TokenStore, read_step_tokens

    rng = np.random.default_rng(0)

    def step(n):
        return {"pos": np.arange(n, dtype=np.int32), "dH": rng.normal(size=n).astype(np.float32),
                "kl": rng.random(n).astype(np.float32), "w_ids": rng.integers(0, 9, (n, 5)).astype(np.int32),
                "w_lp": -rng.random((n, 5)).astype(np.float32), "o_ids": rng.integers(0, 9, (n, 5)).astype(np.int32),
                "o_lp": -rng.random((n, 5)).astype(np.float32), "texts": {i: f"t{i}" for i in range(9)}}

    store = TokenStore(tmp_path / "tokens")
    a, b, c = step(7), step(3), step(4)
    store.append("k1", 1, a)
    store.append("k1", 2, b)
    store.append("k2", 5, c)
    store.append("k1", 3, step(5))
    with open(store.partial("k1"), "r+b") as f:  # a kill in the middle of step 3's append
        f.truncate(f.seek(0, 2) - 40)
    assert store.recover() == 2 and not list((tmp_path / "tokens").glob("*.partial.arrows"))

    def sealed():  # what a probe's session does when it ends: its files sealed, then read only as sealed
        write_outputs(tmp_path, {}, files=sorted((tmp_path / "tokens").glob("*.parquet")))
    sealed()
    k1, k2 = read_step_tokens(tmp_path / "tokens", "k1"), read_step_tokens(tmp_path / "tokens", "k2")
    assert sorted(k1) == [1, 2] and sorted(k2) == [5]
    # a later session appends step 2 again (its row was lost) and step 4: folded into the file kept, step 2 replaced
    b2, d = step(6), step(2)
    store.append("k1", 2, b2)
    store.append("k1", 4, d)
    store.commit("k1")
    with pytest.raises(RunError, match="changed since its probe wrote it"):  # folded after the seals: refused
        read_step_tokens(tmp_path / "tokens", "k1")
    sealed()
    k1 = read_step_tokens(tmp_path / "tokens", "k1")
    assert sorted(k1) == [1, 2, 4] and len(k1[2]["pos"]) == 6
    for got, want in ((k1[1], a), (k1[2], b2), (k1[4], d), (k2[5], c)):
        for col in ("pos", "dH", "kl", "w_ids", "w_lp", "o_ids", "o_lp"):
            assert got[col].dtype == want[col].dtype and np.array_equal(got[col], want[col]), col
        assert got["texts"] == want["texts"]


async def test_the_probe_sends_each_image_from_the_caches_and_lets_go_of_it_when_its_trajectory_is_done(tmp_path):
    """A probe's image caches hold the images of the trajectories in flight only: every request of a trajectory
    finds its image in the caches (read once), and once the trajectory is done the image is gone from them (before:
    kept until the caches' 512 MB bound, ~1.1 GB of RSS at paper scale). Teacher-forced: its with-images side is
    sent (the regenerate probe sends only the side without)."""
    from agent import images as I
    from agent.backends import messages as M
    from agent.rundir import load_run

    mode = "teacher-forced"
    await _run(tmp_path)
    shas = {sha for ln in load_run(tmp_path / "run").index for sha in ln.query_images.values()}
    I.forget_images(shas)  # the probe starts with none cached (another test in this process may have read them)
    seen = []

    def cached(sha):
        with I._lock:
            return I._uri_by_sha.get(sha) is not None

    class Sends(ScriptedBackend):  # a model backend's part: each image part read and encoded for the request
        def _send(self, messages):
            shas = list(M.image_shas(messages))
            seen.append([cached(sha) for sha in shas])
            for m in messages:
                for part in m["content"] if isinstance(m.get("content"), list) else []:
                    if part.get("type") == "image_url":
                        I.load_image(part["image_url"]["url"]).data_uri()

        async def score(self, messages, continuation, **kw):
            self._send(messages)
            return await super().score(messages, continuation, **kw)

        async def generate(self, messages, sampling=None):
            self._send(messages)
            return await super().generate(messages, sampling)

    sends = Sends([policy] * 50, top_fn=planted)
    res = await probe_run(tmp_path / "run", mode=mode, backend=sends, progress=False, concurrency=1)
    assert len(res["steps"]) == 9 and shas
    assert not any(cached(sha) for sha in shas)  # all trajectories done: none kept
    with_images = [s for s in seen if s]  # a trajectory's later with-images requests found its image cached
    assert len(with_images) == 9 and sum(all(s) for s in with_images) == 9 - 3


async def test_probe_refuses_to_pair_scaled_with_raw(tmp_path):
    await _run(tmp_path)  # recorded with raw semantics
    scaled = ScriptedBackend([policy] * 50, top_fn=planted, semantics=LogprobSemantics("scaled", 0.2))
    with pytest.raises(RunError, match="no step with query images was probed"):
        await probe_run(tmp_path / "run", backend=scaled, progress=False)
    failures = json.loads((tmp_path / "run" / "probes" / "entropy-regenerate" / "probe.json").read_text())["failures"]
    assert len(failures) == 9 and "different distributions" in failures[0]


def test_kl_union_tail():
    ids, lps = [1, 2, 3], [math.log(0.5), math.log(0.3), math.log(0.1)]
    assert kl_union_tail(ids, lps, ids, lps) == pytest.approx(0.0, abs=1e-12)
    # hand computed: P = {1: .5, 2: .3, rest: .2}, Q = {1: .3, 2: .5, rest: .2}
    p = kl_union_tail([1, 2], [math.log(0.5), math.log(0.3)], [2, 1], [math.log(0.5), math.log(0.3)])
    assert p == pytest.approx(0.5 * math.log(0.5 / 0.3) + 0.3 * math.log(0.3 / 0.5))
    # a token only in P's top-k gets an even share of Q's tail (shared with Q's rest bin)
    p = kl_union_tail([1, 2], [math.log(0.6), math.log(0.2)], [1], [math.log(0.6)])
    assert p == pytest.approx(0.6 * 0 + 0.2 * math.log(0.2 / 0.2) + 0.2 * math.log(0.2 / 0.2))
    assert np.isfinite(kl_union_tail([1], [0.0], [2], [0.0]))


def test_stats_helpers():
    assert np.isnan(bootstrap_ci([1.0])[0])
    lo, hi = bootstrap_ci([1.0, 2.0, 3.0, 4.0])
    assert 1.0 <= lo < 2.5 < hi <= 4.0
    assert np.isnan(wilcoxon_p([0.0, 0.0])) and wilcoxon_p([1, 2, 3, 4, 5, 6, 7, 8]) < 0.01
    assert mcnemar_p([1, 1, 1, 0], [1, 1, 1, 0]) == 1.0
    assert mcnemar_p([1] * 10, [0] * 10) < 0.01


@pytest.mark.model
def test_wilcoxon_normal_approximation_equals_scipy():
    """Above 50 differences without zeros wilcoxon_p computes SciPy's asymptotic p itself (no scipy.stats
    import); it must equal SciPy's, ties included; small samples and zeros still go to SciPy."""

    from scipy.stats import wilcoxon

    rng = np.random.default_rng(3)
    for n, shift, digits in [(51, 0.0, None), (400, 0.1, 1), (2000, 0.02, 3), (5087, 0.3, None), (60, 5.0, None)]:
        d = rng.normal(shift, 1.0, n)
        if digits is not None:
            d = np.round(d, digits)  # many tied magnitudes
        d[d == 0] = 0.5
        want = float(wilcoxon(d, zero_method="wilcox").pvalue)
        assert math.isclose(wilcoxon_p(d), want, rel_tol=1e-9, abs_tol=1e-300), (n, shift, digits)
    small = rng.normal(0.2, 1.0, 30)
    assert wilcoxon_p(small) == float(wilcoxon(small, zero_method="wilcox").pvalue)  # exact: SciPy's
    with_zero = np.r_[rng.normal(0.2, 1.0, 80), 0.0]
    assert wilcoxon_p(with_zero) == float(wilcoxon(with_zero, zero_method="wilcox").pvalue)


@pytest.mark.slow
def test_no_argument_demo_runs_end_to_end(tmp_path, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setenv("MMCF_TINY_MODEL_DIR", str(tiny_model_dir))
    assert entropy_main(["--demo-dir", str(tmp_path / "demo"), "--demo-samples", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "RANDOMLY INITIALISED" in out and "meaningless" in out and "step" in out
    d = tmp_path / "demo" / "probes" / "entropy-regenerate"
    assert (d / "fig2b_entropy.png").exists() and (d / "steps.parquet").exists()
    # the in-process model knows the exact entropy: the bounds hold it at every step, on both sides
    import pandas as pd

    cal = pd.read_csv(d / "bounds_calibration.csv")
    assert set(cal.context) == {"with", "without"} and (cal.covered == 1.0).all() and (cal.n_missed == 0).all()
    assert (cal.gap_low_p50 >= -1e-4).all() and (cal.gap_high_p50 >= -1e-4).all()
    steps = pd.read_parquet(d / "steps.parquet")
    ok = steps.dropna(subset=["H_exact_with"])
    assert len(ok) and (ok.H_with <= ok.H_exact_with + 1e-4).all() and (ok.H_exact_with <= ok.H_high_with + 1e-4).all()
    # the demo chain also draws the forking-token panel and runs the fidelity check first (warm, in-process)
    assert (d / "fig2b_forking.png").exists() and (d / "forking.csv").exists()
    rep = json.loads((tmp_path / "demo" / "probes" / "fidelity" / "fidelity.json").read_text())
    assert rep["ok"] and rep["checks"]["warm"]["n_tokens"] > 0 and "skipped" in rep["checks"]["paths"]
    assert json.loads((d / "probe.json").read_text())["fidelity"]["ok"] is True
    assert "serving fidelity: ok" in out


@pytest.mark.slow
async def test_probe_applies_the_shared_selection_rule_and_saves_table10(tmp_path):
    def first_unparsed_for_demo_2(messages):
        question = next(p["text"] for p in messages[1]["content"] if p.get("type") == "text" and "Question:" in p["text"])
        if "flag" in question and sum(m["role"] == "assistant" for m in messages) == 0:
            return "<think>\nhmm\n</think>\n\nI am not sure what to do."  # an immediate parsing failure
        return policy(messages)

    backend = ScriptedBackend([first_unparsed_for_demo_2] * 500, top_fn=planted)
    await run(RunConfig(method="react", out=str(tmp_path / "run"), limit=3, progress=False), [], backends=[backend])
    res = await probe_run(tmp_path / "run", backend=backend, progress=False)
    assert set(res["steps"].sample_id) == {"demo_1", "demo_3"}
    import pandas as pd

    t = pd.read_csv(res["out"] / "exclusions.csv").set_index("benchmark")
    assert t.loc["All", "total"] == 3 and t.loc["All", "first_call_unparsed"] == 1 and t.loc["All", "kept"] == 2
    # --include-unparsed keeps it (and says so in probe.json)
    res2 = await probe_run(tmp_path / "run", backend=backend, progress=False, include_unparsed=True,
                           out_dir=tmp_path / "incl")
    assert set(res2["steps"].sample_id) == {"demo_1", "demo_2", "demo_3"}
    assert json.loads((tmp_path / "incl" / "probe.json").read_text())["include_unparsed"] is True


async def test_probe_refuses_a_run_recorded_by_another_model(tmp_path):
    from agent.preflight import PreflightError

    await run(RunConfig(method="react", out=str(tmp_path / "run"), limit=1, progress=False), [],
              backends=[ScriptedBackend([policy] * 50, model="qwen3.5-27b")])
    other = ScriptedBackend([policy] * 50, model="qwen3.5-9b")
    with pytest.raises(PreflightError, match="qwen3.5-27b.*qwen3.5-9b"):
        await probe_run(tmp_path / "run", backend=other, progress=False)
    assert not (tmp_path / "run" / "probes" / "entropy-regenerate" / "steps.jsonl").exists()
    res = await probe_run(tmp_path / "run", backend=other, progress=False, force=True)  # recorded, not silent
    info = json.loads((res["out"] / "probe.json").read_text())
    assert info["forced_model_mismatch"] is True and "qwen3.5-9b" in info["model"]["forced_mismatch"]


async def test_one_probe_per_output_directory_and_duplicate_rows_are_read_once(tmp_path, capsys):
    """Two probes on one run would append the same steps twice (n 120 -> 240, another Wilcoxon p): the second is
    refused while the first holds the directory, and rows written twice by anything else count once."""
    from agent.rundir import output_lock

    backend = await _run(tmp_path)
    out = tmp_path / "run" / "probes" / "entropy-regenerate"
    with output_lock(out, "entropy probe"):  # another probe is writing here
        with pytest.raises(RunError, match="another entropy probe is writing here"):
            await probe_run(tmp_path / "run", backend=backend, progress=False)
    res = await probe_run(tmp_path / "run", backend=backend, progress=False)
    assert len(res["steps"]) == 9
    steps_path = out / "steps.jsonl"
    steps_path.write_bytes(steps_path.read_bytes() * 2)  # what two unlocked probes left
    capsys.readouterr()
    res = await probe_run(tmp_path / "run", backend=backend, progress=False)
    assert len(res["steps"]) == 9 and (res["summary"]["n"] == 3).all()
    assert "9 duplicate step row(s) ignored" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["regenerate", "teacher-forced"])
async def test_a_damaged_sidecar_skips_its_trajectory_names_it_and_the_rest_is_probed(tmp_path, mode):
    """X2/X3: one truncated sidecar does not stop the probe: its trajectory is skipped, named and counted."""
    from agent.rundir import load_run

    backend = await _run(tmp_path)
    run = load_run(tmp_path / "run")
    victim = run.tokens_path(run.full(run.index[0]))
    victim.write_bytes(victim.read_bytes()[: len(victim.read_bytes()) // 2])
    res = await probe_run(tmp_path / "run", mode=mode, backend=backend, progress=False)
    assert len(res["steps"]) == 6 and len(res["failures"]) == 1  # the two intact trajectories' 3 steps each
    assert victim.name in res["failures"][0] and run.index[0].sample_id in res["failures"][0]


def test_the_command_with_its_fidelity_check_skips_a_damaged_sidecar_and_exits_1(tmp_path, capsys):
    """X2/X3 through the command: the serving-fidelity check that runs first takes another trajectory, the probe
    skips the damaged one, names it, probes the rest, and the command exits 1."""
    from agent.run import main as run_main
    from agent.rundir import load_run

    run_dir = tmp_path / "run"
    assert run_main(["--method", "react", "--backend", "scripted", "--limit", "3", "--out", str(run_dir),
                     "--no-progress"]) == 0
    run = load_run(run_dir)
    first = min(run.index, key=lambda s: s.key)  # the one the fidelity check takes first
    victim = run.tokens_path(first)
    victim.write_bytes(victim.read_bytes()[: len(victim.read_bytes()) // 2])
    capsys.readouterr()
    assert entropy_main([str(run_dir), "--backend", "scripted", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"failed: {first.sample_id}/t{first.trial}" in err and victim.name in err
    assert (run_dir / "probes" / "entropy-regenerate" / "summary.csv").exists()
