"""The serving-fidelity check (probes/fidelity/) against the loopback SGLang: a consistent server passes and
the probe goes on; a server whose cached state leaks into a repeated request is refused before any probing,
unless --force, which is recorded."""
from __future__ import annotations

import json

import pytest

from probes.entropy import main as entropy_main
from probes.fidelity import main as fidelity_main
from serving.fakes.policy import agent_policy
from serving.fakes.sglang_server import FakeSGLang
from tests.records import record_react_run


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, tiny_model_dir):
    """A ReAct run recorded through SGLang's native API (the tiny model's tokenizer: ids that can be scored)."""
    out = tmp_path_factory.mktemp("fid") / "r"
    record_react_run(out, tiny_model_dir, limit=3)
    return out


def _args(url, tiny, run):
    return [str(run), "--backend", "sglang", "--endpoint", url, "--model-dir", str(tiny), "--no-progress"]


@pytest.mark.slow
def test_a_consistent_server_passes_and_the_probe_records_it(recorded, tiny_model_dir, capsys):
    with FakeSGLang(reply=agent_policy, tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir)) as srv:
        assert fidelity_main(_args(srv.url, tiny_model_dir, recorded)[:-1] + ["--samples", "3"]) == 0
        assert srv.requests.count("/flush_cache") == 3  # one cold scoring per call
        rep = json.loads((recorded / "probes" / "fidelity" / "fidelity.json").read_text())
        assert rep["ok"] and rep["calls"] == 3
        assert rep["checks"]["warm"]["max_abs"] == 0.0 and rep["checks"]["cold"]["overlap_mean"] == 1.0
        assert "weights are not local" in rep["checks"]["local"]["skipped"]
        paths = rep["checks"]["paths"]  # the chat path rendered the same prompt and chose the same greedy tokens
        assert paths["ok"] and paths["n_tokens"] > 0 and not paths["notes"] and paths["by"] == ["ids"]
        assert all(p["native"] == p["chat"] > 20 for p in paths["prompt_tokens"])
        assert srv.requests.count("/v1/chat/completions") == 3
        # the fake's tokens are near-certain (the chosen one at ~-0.05): no token tells raw from scaled
        assert rep["checks"]["mode"]["server"] is None and "near-certain" in rep["checks"]["mode"]["skipped"]
        out = recorded / "probes" / "tf-ok"
        assert entropy_main(_args(srv.url, tiny_model_dir, recorded) + ["--mode", "teacher-forced", "--force",
                                                                        "--out", str(out)]) == 0
    probe = json.loads((out / "probe.json").read_text())
    assert probe["fidelity"]["ok"] is True and probe["fidelity"]["failed"] == []


@pytest.mark.slow
def test_a_cache_leak_is_refused_before_probing_unless_forced(recorded, tiny_model_dir, capsys):
    with FakeSGLang(reply=agent_policy, tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir),
                    leak=0.3) as srv:
        assert fidelity_main(_args(srv.url, tiny_model_dir, recorded)[:-1] + ["--samples", "2"]) == 2
        err = capsys.readouterr().err
        assert "not fit to be probed" in err and "warm: mean |Δlogprob| 0.300" in err
        rep = json.loads((recorded / "probes" / "fidelity" / "fidelity.json").read_text())
        assert not rep["ok"] and not rep["checks"]["warm"]["ok"]
        assert rep["checks"]["cold"]["ok"]  # after a flush the first result comes back: the leak is the cache's
        # the entropy probe runs the check first and refuses: no probing request was sent
        out = recorded / "probes" / "tf-leak"
        n = srv.requests.count("/generate")
        assert entropy_main(_args(srv.url, tiny_model_dir, recorded) + ["--mode", "teacher-forced", "--out", str(out)]) == 2
        assert "not fit to be probed" in capsys.readouterr().err
        checked = srv.requests.count("/generate") - n
        # 3 calls x (warm, warm, cold, the mode check's generation and its scoring, the native greedy generation
        # of the paths check), then stop
        assert checked == 3 * 6 and not (out / "steps.jsonl").exists()
        # --force probes anyway and says so in probe.json; --skip-fidelity skips and says that
        assert entropy_main(_args(srv.url, tiny_model_dir, recorded) + ["--mode", "teacher-forced", "--out", str(out),
                                                                        "--force"]) == 0
        probe = json.loads((out / "probe.json").read_text())
        assert probe["fidelity"]["ok"] is False and probe["fidelity"]["forced"] is True and probe["fidelity"]["failed"]
        out2 = recorded / "probes" / "tf-skip"
        assert entropy_main(_args(srv.url, tiny_model_dir, recorded) + ["--mode", "teacher-forced", "--out", str(out2),
                                                                        "--force", "--skip-fidelity"]) == 0
    assert json.loads((out2 / "probe.json").read_text())["fidelity"] == {"skipped": "--skip-fidelity"}


@pytest.mark.slow
def test_a_server_of_another_model_is_refused_as_such_before_the_fidelity_check(recorded, tiny_model_dir, capsys):
    with FakeSGLang(reply=agent_policy, tokenizer_dir=str(tiny_model_dir), model_name="another-model") as srv:
        assert entropy_main(_args(srv.url, tiny_model_dir, recorded) + ["--mode", "teacher-forced", "--out",
                                                                        str(recorded / "probes" / "tf-other")]) == 2
        assert srv.requests.count("/generate") == 0 and srv.requests.count("/flush_cache") == 0
    assert "serves the weights 'another-model'" in capsys.readouterr().err  # the model check, not fidelity


@pytest.mark.slow
def test_a_chat_path_that_renders_another_prompt_is_refused(recorded, tiny_model_dir, capsys):
    """The server's chat layer renders with its own template (as a server started with --chat-template would):
    the same messages become another prompt there, which the paths check names; --no-paths skips it."""
    other = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content if m.content is string else '' }}" \
            "<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
    with FakeSGLang(reply=agent_policy, tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir),
                    chat_template=other) as srv:
        assert fidelity_main(_args(srv.url, tiny_model_dir, recorded)[:-1] + ["--samples", "2"]) == 2
        err = capsys.readouterr().err
        assert "paths:" in err and "prompt tokens differ" in err and "chat template" in err
        rep = json.loads((recorded / "probes" / "fidelity" / "fidelity.json").read_text())
        assert not rep["checks"]["paths"]["ok"] and rep["checks"]["warm"]["ok"] and rep["checks"]["cold"]["ok"]
        n = srv.requests.count("/v1/chat/completions")
        assert fidelity_main(_args(srv.url, tiny_model_dir, recorded)[:-1] + ["--samples", "2", "--no-paths"]) == 0
        assert srv.requests.count("/v1/chat/completions") == n
    rep = json.loads((recorded / "probes" / "fidelity" / "fidelity.json").read_text())
    assert "--no-paths" in rep["checks"]["paths"]["skipped"]


@pytest.mark.slow
def test_the_teacher_forced_probe_is_the_same_over_flat_and_nested_logprobs(recorded, tiny_model_dir):
    """The whole teacher-forced probe over SGLang's flat top-logprob arrays (the default) and over the nested lists
    (--nested-logprobs): the requests ask for what was chosen, and every step's numbers are equal."""
    import pandas as pd

    got = {}
    for name, extra in (("flat", []), ("nested", ["--nested-logprobs"])):
        with FakeSGLang(reply=agent_policy, tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir)) as srv:
            out = recorded / "probes" / f"tf-{name}"
            assert entropy_main(_args(srv.url, tiny_model_dir, recorded) + ["--mode", "teacher-forced", "--force",
                                                                            "--out", str(out), *extra]) == 0
            scoring = [b for b in srv.bodies if (b.get("sampling_params") or {}).get("max_new_tokens") == 0]
            assert scoring and all(bool(b.get("return_flat_raw_top_logprobs")) == (name == "flat") for b in scoring)
        got[name] = pd.read_csv(out / "steps.csv").sort_values(["sample_id", "trial", "step"]).reset_index(drop=True)
    cols = [c for c in ("H_with", "H_without", "dH", "kl_with_without", "H_high_with", "dH_low") if c in got["flat"]]
    assert len(got["flat"]) > 0 and "dH" in cols and got["flat"][cols].equals(got["nested"][cols])


def _distribution_tokens(logits, chosen, temperature, mode):
    """One token per row of ``logits``: the generated side as SGLang's sampler reports it in ``mode``, and the
    teacher-forced side (raw, top-20)."""
    import numpy as np

    from agent.backends.tokens import TokenArrays

    z = np.asarray(logits, np.float64)
    raw = z - np.log(np.exp(z).sum(1, keepdims=True))
    zt = z / temperature
    scaled = zt - np.log(np.exp(zt).sum(1, keepdims=True))
    rows = np.arange(len(z))
    order = np.argsort(-raw, axis=1)[:, :20]

    def arrays(lp):
        return TokenArrays(chosen, [""] * len(z), lp[rows, chosen], order, np.take_along_axis(lp, order, 1))

    return arrays(raw if mode == "raw" else scaled), arrays(raw)


@pytest.mark.parametrize("served", ["raw", "scaled"])
def test_the_mode_check_tells_raw_from_scaled_and_refuses_a_run_that_records_the_other(served):
    """Generated logprobs read against the teacher-forced (raw) ones at the run's temperature: a server returning
    raw logprobs and one returning scaled ones are told apart; a verdict other than the run's recorded mode fails,
    naming both; at T = 1 (or 0) the check says it cannot tell (issue 58, item 4)."""
    import numpy as np

    from probes.fidelity import MODE_SEPARATION, mode_readings, mode_verdict

    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2.0, (24, 300))
    chosen = rng.integers(0, 300, 24)  # sampled tokens, many of them far from certain
    gen, forced = _distribution_tokens(logits, chosen, 0.2, served)
    d_raw, d_scaled = mode_readings(gen, forced, 0.2)
    assert len(d_raw) > 10
    for recorded in ("raw", "scaled"):
        v = mode_verdict(d_raw, d_scaled, 0.2, recorded)
        assert v["server"] == served and v["ok"] == (recorded == served)
    near = d_raw if served == "raw" else d_scaled
    far = d_scaled if served == "raw" else d_raw
    # the scaled reading from the top 20 alone: the tail beyond weighs exp(-gap / T), ~1e-3 nat here at most
    assert near.max() < 0.01 and far.min() >= MODE_SEPARATION
    # a prefill/decode difference of 0.01 nat ("close, not identical") keeps the verdict
    v = mode_verdict(d_raw + 0.01, d_scaled + 0.01, 0.2, served)
    assert v["server"] == served and v["ok"]
    gen1, forced1 = _distribution_tokens(logits, chosen, 1.0, served)
    v = mode_verdict(*mode_readings(gen1, forced1, 1.0), 1.0, "scaled")
    assert v["ok"] and v["server"] is None and "T = 1" in v["skipped"]
