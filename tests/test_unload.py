"""ReAct-Adaptive (--image-unload adaptive, agent/methods/unload.py), its calibration and its figure.

The scripted demo model plants the query images' influence by category: they matter for the first g steps
(Atomic factuality g=1, Dynamic information-seeking g=2, Visual deep research g=4) and not after. An online
detector sees a step's influence only after generating it, so with patience M it detects at step g+M and
unloads from g+M+1: the tests assert exactly that, per category.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from agent import judge
from agent import run as runner
from agent.backends.demo_model import GROUNDING_STEPS
from agent.methods.unload import DEFAULT_PATIENCE, DEFAULT_THRESHOLD, UnloadPolicy
from agent.rundir import load_run
from probes import calibrate_unload, entropy, removal
from tests.records import recorded_lines


def _adaptive(out, *extra, backend=("--backend", "scripted")):
    return runner.main(["--method", "react", *backend, "--image-unload", "adaptive", "--out", str(out),
                        "--no-progress", *extra])


@pytest.mark.parametrize("patience", [1, 2])
def test_releases_at_the_planted_step_per_category(tmp_path, patience):
    assert _adaptive(tmp_path / "a", "--unload-threshold", "0.5", "--unload-patience", str(patience)) == 0
    run = load_run(tmp_path / "a")
    assert run.header.image_unload["threshold_source"] == "given (--unload-threshold)"
    assert run.header.label == f"react-adaptive-kl<0.5-m{patience}"
    seen = set()
    for ln in recorded_lines(run):
        g = GROUNDING_STEPS[ln["paper_category"]]
        ir = ln["image_unload"]
        assert ir["detect_step"] == g + patience and ir["unload_step"] == g + patience + 1, (ln["sample_id"], ir)
        q = [c["n_query_images"] for c in ln["calls"]]
        n_img = len(ln["query_images"])
        assert q == [n_img] * (g + patience) + [0] * (len(q) - g - patience)   # the Removal@k projection
        probes = [e for e in ln["events"] if e["type"] == "unload_probe"]
        assert [e["call_index"] for e in probes] == list(range(1, g + patience + 1))
        assert [e["decision"] for e in probes] == ["keep"] * (g + patience - 1) + ["unload"]
        assert all(e["influence"] > 0.5 for e in probes[:g]) and all(e["influence"] < 0.5 for e in probes[g:])
        assert ir["probes"] == len(probes) and ir["scoring_calls"] == len(probes)  # raw generation: one prefill each
        assert ln["status"] == "ok" and ln["answer"] == ln["gold"]                  # unloaded after grounding
        seen.add(ln["paper_category"])
    assert seen == set(GROUNDING_STEPS)


def test_show_renders_the_release(tmp_path, capsys):
    from agent import show

    assert _adaptive(tmp_path / "a", "--unload-threshold", "0.5", "--unload-patience", "1", "--limit", "1") == 0
    assert show.main([str(tmp_path / "a"), "demo_1"]) == 0
    text = capsys.readouterr().out
    assert "unload probe (kl): influence 1.28 >= ε=0.5, streak 0 -> keep" in text
    assert "-> UNLOAD: no query images from step 3 on" in text
    assert "detected at step 2, images removed from step 3 on; 2 probes, 2 scoring calls" in text


@pytest.mark.slow
def test_probe_calls_do_not_consume_the_budget_and_match_the_entropy_probe(tmp_path):
    """The online influence is the teacher-forced probe's KL for the same step: one quantity, two places."""
    assert runner.main(["--method", "react", "--backend", "scripted", "--out", str(tmp_path / "plain"),
                        "--no-progress"]) == 0
    assert entropy.main([str(tmp_path / "plain"), "--mode", "teacher-forced", "--no-progress"]) == 0
    tf = pd.read_parquet(tmp_path / "plain" / "probes" / "entropy-teacher-forced" / "steps.parquet")
    assert _adaptive(tmp_path / "a", "--unload-threshold", "0.5", "--unload-patience", "1") == 0
    plain = {ln.sample_id: ln for ln in load_run(tmp_path / "plain").lines}
    run = load_run(tmp_path / "a")
    for ln in run.lines:
        assert ln.n_calls == plain[ln.sample_id].n_calls  # same agent steps: probes are not LLM calls
        for e in (e for e in ln.events if e.type == "unload_probe"):
            row = tf[(tf.sample_id == ln.sample_id) & (tf.step == e.call_index)].iloc[0]
            assert e.kl == pytest.approx(row.kl_with_without, abs=1e-5)
            assert e.dH == pytest.approx(row.dH, abs=1e-5)
        # per token, in the sidecar: KL / ΔH on the probed calls' think tokens, NaN elsewhere
        tok = run.tokens(ln)
        probed = {e.call_index for e in ln.events if e.type == "unload_probe"}
        on = np.isin(tok["call"], list(probed)) & tok["think"]
        assert np.isfinite(tok["unload_kl"][on]).all() and np.isnan(tok["unload_kl"][~on]).all()


def test_refusals_before_any_work(tmp_path, capsys):
    out = tmp_path / "x"
    assert _adaptive(out, backend=("--backend", "openai", "--endpoint", "http://127.0.0.1:9")) == 2
    err = capsys.readouterr().err
    assert "--backend openai cannot score" in err and "local, sglang, scripted" in err
    assert not out.exists()
    assert runner.main(["--method", "react", "--backend", "scripted", "--unload-threshold", "0.1", "--out", str(out),
                        "--no-progress"]) == 2
    assert "need --image-unload adaptive" in capsys.readouterr().err
    assert _adaptive(out, "--remove-images-from-step", "2") == 2
    assert "choose one" in capsys.readouterr().err
    assert runner.main(["--method", "mmcontextfold", "--backend", "scripted", "--image-unload", "adaptive",
                        "--out", str(out), "--no-progress"]) == 2
    assert "--method react only" in capsys.readouterr().err
    assert _adaptive(out, "--unload-threshold", "no-such-file.json") == 2
    assert "neither a number nor a calibration.json" in capsys.readouterr().err
    assert not out.exists()


def test_defaults_are_recorded_as_uncalibrated():
    p = UnloadPolicy.from_args()
    assert (p.signal, p.threshold, p.patience) == ("kl", DEFAULT_THRESHOLD["kl"], DEFAULT_PATIENCE)
    assert "not calibrated" in p.source
    assert UnloadPolicy.from_args("dH").threshold == DEFAULT_THRESHOLD["dH"]


@pytest.mark.slow
def test_on_the_embedded_tiny_model(tmp_path, tiny_model_dir, monkeypatch):
    """The local backend scores in-process; its generation logprobs are scaled, so both sides are scored."""
    monkeypatch.setenv("MMCF_TINY_MODEL_DIR", str(tiny_model_dir))
    assert _adaptive(tmp_path / "t", "--limit", "2", "--t-max", "4", "--max-tokens", "16",
                     backend=("--backend", "local")) == 0
    for ln in recorded_lines(tmp_path / "t"):
        probes = [e for e in ln["events"] if e["type"] == "unload_probe"]
        assert probes and all(e["scoring_calls"] == 2 for e in probes)   # scaled generation: raw on both sides
        assert all(e["kl"] is not None and e["kl"] >= 0 for e in probes)
        assert ln["n_calls"] <= 4


@pytest.mark.slow
def test_on_sglang_native(tmp_path, tiny_model_dir):
    """SGLang's native /generate: scoring by prompt logprobs (the loopback server's wire format)."""
    from serving.fakes.sglang_server import FakeSGLang

    with FakeSGLang(tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir)) as srv:
        assert _adaptive(tmp_path / "s", "--limit", "1", "--t-max", "4", "--max-tokens", "16",
                         "--unload-patience", "1", "--unload-threshold", "0.01",
                         backend=("--backend", "sglang", "--endpoint", srv.url, "--model-dir", str(tiny_model_dir))) == 0
        scored = [b for b in srv.bodies if b.get("max_new_tokens") == 0 or (b.get("sampling_params") or {}).get("max_new_tokens") == 0]
    ln = recorded_lines(tmp_path / "s")[0]
    probes = [e for e in ln["events"] if e["type"] == "unload_probe"]
    # the stand-in's distributions ignore images: influence 0, unloaded after the first probed step
    assert probes[0]["kl"] == pytest.approx(0.0, abs=1e-6) and ln["image_unload"]["unload_step"] == 2
    assert [c["n_query_images"] > 0 for c in ln["calls"]][:2] == [True, False]
    assert len(scored) == ln["image_unload"]["scoring_calls"] > 0


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    d = tmp_path_factory.mktemp("cal")
    react = d / "react"
    assert runner.main(["--method", "react", "--backend", "scripted", "--out", str(react), "--no-progress"]) == 0
    assert entropy.main([str(react), "--mode", "teacher-forced", "--no-progress"]) == 0
    assert removal.main([str(react), "--steps", "1..6", "--judge", "exact", "--no-progress"]) == 0
    assert judge.main([str(react), "--judge", "exact", "--no-progress"]) == 0
    assert calibrate_unload.main([str(react)]) == 0
    return d


@pytest.mark.slow
def test_calibration_places_the_threshold_between_the_planted_levels(calibrated):
    cal = json.loads((calibrated / "react" / "probes" / "calibrate_unload" / "calibration.json").read_text())
    tf = pd.read_parquet(calibrated / "react" / "probes" / "entropy-teacher-forced" / "steps.parquet")
    grounding = tf[[s <= GROUNDING_STEPS[c] for s, c in zip(tf.step, tf.paper_category)]].kl_with_without
    after = tf[[s > GROUNDING_STEPS[c] for s, c in zip(tf.step, tf.paper_category)]].kl_with_without
    c = cal["chosen"]
    assert after.max() < c["threshold"] < grounding.min()
    assert c["patience"] == 1 and c["uncovered"] == 0 and c["tpr"] == 1.0
    assert c["est_accuracy"] == 100.0 and c["mean_image_steps"] < cal["full_react"]["mean_image_steps"]
    steps = pd.read_csv(calibrated / "react" / "probes" / "calibrate_unload" / "steps.csv")
    lab = steps[steps.needed.notna()]
    # "needed" = removing the images from the next step changed the outcome: exactly the steps before g
    assert (lab.needed.astype(bool) == [s < GROUNDING_STEPS[c] for s, c in zip(lab.step, lab.paper_category)]).all()


def test_calibration_refuses_without_its_inputs(tmp_path, capsys):
    assert runner.main(["--method", "react", "--backend", "scripted", "--limit", "1", "--out", str(tmp_path / "r"),
                        "--no-progress"]) == 0
    assert calibrate_unload.main([str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "probes.entropy" in err and "--mode teacher-forced" in err and "probes.removal" in err


@pytest.mark.slow
def test_calibrated_run_and_the_release_figure(calibrated):
    from analysis.report import make_report

    react = calibrated / "react"
    cal = react / "probes" / "calibrate_unload" / "calibration.json"
    runs = []
    for name, eps in (("cal", str(cal)), ("loose", "2.0")):
        out = calibrated / f"adaptive-{name}"
        assert _adaptive(out, "--unload-threshold", eps) == 0
        assert judge.main([str(out), "--judge", "exact", "--no-progress"]) == 0
        runs.append(str(out))
    h = load_run(runs[0]).header.image_unload
    assert h["threshold_source"].startswith(f"calibrated: {cal}") and h["patience"] == 1
    rep = make_report(react=[str(react)], unload_runs=runs, out=calibrated / "fig", judge="exact")
    assert "fig_unload" in rep["made"]
    pts = pd.read_csv(calibrated / "fig" / "fig_release_points.csv")
    full = pts[pts.series == "ReAct (images kept)"].iloc[0]
    adap = pts[pts.series == "adaptive"].set_index("threshold")
    reps = pts[pts.series == "R@k (replays)"].set_index("k")
    assert full.accuracy == 100.0 and sorted(reps.index) == [1, 2, 3, 4, 5, 6]
    good = adap.loc[adap.index < 1.0].iloc[0]
    assert good.accuracy == 100.0 and good.image_steps < full.image_steps   # as accurate, fewer images
    assert adap.loc[2.0].accuracy < 100.0                                      # too loose: unloaded while grounding
    st = pd.read_csv(calibrated / "fig" / "fig_release_steps.csv")
    med = st[st.calibrated].groupby("paper_category").unload_step.median()
    assert med["Atomic factuality"] < med["Dynamic information-seeking"] < med["Visual deep research"]
    assert (calibrated / "fig" / "fig_unload.png").exists() and (calibrated / "fig" / "fig_unload.pdf").exists()
