"""python -m serving.check: the smoke test users run first."""
import json

import pytest

from serving.check import main


def run(capsys, *argv):
    rc = main(["--json", *argv])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.slow
@pytest.mark.model
def test_check_local_tiny_model(capsys, tiny_model_dir, red_image):
    rc, rep = run(capsys, "--model-dir", str(tiny_model_dir), "--image", str(red_image), "--max-tokens", "6")
    assert rc == 0 and rep["ok"] and rep["problems"] == []
    t = rep["tokens"][0]
    assert set(t) >= {"id", "text", "logprob", "think", "top", "entropy_grouped", "entropy_exact"}
    assert len(t["top"]) == 20 and t["entropy_exact"] >= t["entropy_grouped"] - 1e-5


def test_check_against_sglang_chat_and_native(capsys, fake_sglang, tiny_model_dir):
    rc, rep = run(capsys, "--endpoint", fake_sglang.url, "--max-tokens", "40")
    assert rc == 0 and rep["ok"], rep["problems"]
    assert rep["tokens"][0]["entropy_exact"] is None and rep["tokens"][0]["think"]
    # the native path: the runner's model check runs first, so a server of other weights fails here as agent.run
    # would refuse it (the fixture serves "fake-qwen3.5", not the --model-dir's weights)
    rc, rep = run(capsys, "--endpoint", fake_sglang.url, "--backend", "sglang", "--model-dir", str(tiny_model_dir))
    assert rc == 1 and "serves the weights 'fake-qwen3.5'" in rep["problems"][0]
    from serving.fakes.sglang_server import FakeSGLang

    with FakeSGLang(tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir)) as srv:
        rc, rep = run(capsys, "--endpoint", srv.url, "--backend", "sglang", "--model-dir", str(tiny_model_dir))
    assert rc == 0 and rep["ok"], rep["problems"]


def test_check_fails_on_unsorted_alternatives(capsys, fake_sglang, monkeypatch):
    from serving.fakes import sglang_tokens

    orig = sglang_tokens.top
    monkeypatch.setattr(sglang_tokens, "top", lambda *a: list(reversed(orig(*a))))
    rc, rep = run(capsys, "--endpoint", fake_sglang.url, "--server", "other")
    # the chat parser sorts alternatives itself, but the chosen token then disagrees with its list
    assert rc == 1 and not rep["ok"] and rep["problems"]


def test_check_reports_bad_inputs(capsys, tmp_path, fake_sglang):
    rc, rep = run(capsys, "--model-dir", str(tmp_path / "nope"))
    assert rc == 1 and "nope" in rep["problems"][0]
    bad = tmp_path / "x.png"
    bad.write_text("text")
    rc, rep = run(capsys, "--endpoint", fake_sglang.url, "--image", str(bad))
    assert rc == 1 and "x.png" in rep["problems"][0]
    rc, rep = run(capsys, "--endpoint", "http://127.0.0.1:9")
    assert rc == 1 and "127.0.0.1:9" in rep["problems"][0]


def test_the_next_command_it_prints_runs(capsys, tiny_model_dir, tmp_path):
    """The last line names the first run on the backend just checked, with its flags written out: that
    command runs as printed (here against the same server, two samples)."""
    import shlex

    from agent.run import main as run_main
    from serving.fakes.sglang_server import FakeSGLang

    with FakeSGLang(tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir)) as srv:  # serves those weights
        rc = main(["--endpoint", srv.url, "--backend", "sglang", "--model-dir", str(tiny_model_dir), "--max-tokens", "8"])
        last = capsys.readouterr().out.strip().splitlines()[-1]
        argv = shlex.split(last.removeprefix("next: "))[3:]
        argv[argv.index("--out") + 1] = str(tmp_path / "first-run")
        ran = run_main([*argv, "--limit", "2", "--t-max", "2", "--no-progress"])
    assert rc == 0 and last.startswith("next: python -m agent.run --method react --backend sglang --endpoint ")
    assert f"--model-dir {tiny_model_dir}" in last and ran == 0
    assert (tmp_path / "first-run" / "results.jsonl").read_bytes().count(b"\n") == 2
